#include "kvo/gpu/device.hpp"

namespace kvo::gpu {

#ifdef KVO_HAVE_CUDA
int cuda_device_count(std::string* why);
std::string cuda_device_description();
bool built_with_cuda() { return true; }
int device_count(std::string* why) { return cuda_device_count(why); }
std::string device_description() { return cuda_device_description(); }
#else
bool built_with_cuda() { return false; }
int device_count(std::string* why) {
  if (why != nullptr) *why = "built without CUDA";
  return 0;
}
std::string device_description() { return {}; }
#endif

}  // namespace kvo::gpu

// kvo_gpu_testing: host-memory attention with a bug planted in the fast family
// (launch_attention_t<F> of attention_kernels.cuh, instantiated here for the fast family only) or
// in the flash family (launch_flash_attention_t<B>, one instantiation per spec::AttentionBug); and
// the decode kernels with the chunk slots a CUDA block forced (DeviceAttention::slots_per_block),
// and the specialised chunk kernel's run length.
#include <optional>

#include "attention_decode.cuh"
#include "attention_kernels.cuh"
#include "kvo/gpu/testing/faults.hpp"
#include "kvo/spec/outcome.hpp"

namespace kvo::gpu::testing {
namespace {

/// The flash launcher with the spec::AttentionBug of a kFlash fault; none for the others.
std::optional<detail::FlashLaunch> flash_launch(ReadFault fault) {
  switch (fault) {
    case ReadFault::kFlashDropChunkLast:
      return detail::launch_flash_attention_t<spec::AttentionBug::kDropChunkLast>;
    case ReadFault::kFlashScaleOff:
      return detail::launch_flash_attention_t<spec::AttentionBug::kScaleOff>;
    case ReadFault::kFlashNeighbourV:
      return detail::launch_flash_attention_t<spec::AttentionBug::kNeighbourV>;
    case ReadFault::kFlashStopAtMinusOne:
      return detail::launch_flash_attention_t<spec::AttentionBug::kStopAtMinusOne>;
    case ReadFault::kFlashMaskedChunkNan:
      return detail::launch_flash_attention_t<spec::AttentionBug::kMaskedChunkNan>;
    case ReadFault::kIgnoreLocal:
    case ReadFault::kTiesToHigherId:
    case ReadFault::kExpNoLog2e:
    case ReadFault::kIdsWrapAt1024:
      break;
  }
  return std::nullopt;
}

}  // namespace

spec::HostTensor attention_host_faulty(
    ReadFault fault, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, ReadKernel kernel) {
  if (flash_launch(fault).has_value())
    throw spec::Unsupported("planted flash bugs run through flash_attention_host_faulty");
  if (fault != ReadFault::kExpNoLog2e) {  // the indexer's bugs: attention as in production
    return detail::attention_host_via(launch_attention, config, params, batch, q, caches, k_scale,
                                      v_scale, selection, topk, kernel);
  }
  if (kernel != ReadKernel::kFast)
    throw spec::Unsupported("planted attention bugs live in the fast family only");
  const detail::AttentionLaunch launch = detail::launch_attention_t<detail::ReadBug::kExpNoLog2e>;
  return detail::attention_host_via(launch, config, params, batch, q, caches, k_scale, v_scale,
                                    selection, topk, kernel);
}

spec::HostTensor flash_attention_host_faulty(
    ReadFault fault, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk) {
  const std::optional<detail::FlashLaunch> launch = flash_launch(fault);
  if (!launch) throw spec::Unsupported("planted flash bugs are the kFlash faults");
  return detail::flash_attention_host_via(*launch, config, params, batch, q, caches, k_scale,
                                          v_scale, selection, topk);
}

spec::HostTensor flash_attention_host_slots_per_block(
    int per_block, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk) {
  if (per_block < 1) throw spec::Unsupported("flash decode: slots a block must be >= 1");
  return detail::flash_attention_host_via(launch_flash_attention, config, params, batch, q, caches,
                                          k_scale, v_scale, selection, topk, per_block);
}

spec::HostTensor attention_host_slots_per_block(
    int per_block, const spec::ModelConfig& config, const spec::AttentionParams& params,
    const spec::ReadBatch& batch, const spec::HostTensor& q, const spec::LayerCaches& caches,
    const std::vector<float>& k_scale, const std::vector<float>& v_scale,
    const std::vector<std::int32_t>& selection, std::int64_t topk, ReadKernel kernel) {
  if (per_block < 1) throw spec::Unsupported("attention decode: slots a block must be >= 1");
  return detail::attention_host_via(launch_attention, config, params, batch, q, caches, k_scale,
                                    v_scale, selection, topk, kernel, per_block);
}

int decode_run_length(long long total, long long sms, int blocks_per_sm, int most, int forced) {
  return detail::decode_run_length(total, sms, blocks_per_sm, most, forced);
}

}  // namespace kvo::gpu::testing

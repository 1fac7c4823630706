// Dense and lazy cache storage (cache_storage.hpp). The lazy form is one anonymous private mapping
// reserved without swap accounting (MAP_NORESERVE) and kept off transparent huge pages, so that
// touching one byte materialises one host page, not 2 MiB of zeros that would all look resident.
#include "kvo/spec/cache_storage.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>

#include "kvo/spec/outcome.hpp"

namespace kvo::spec {
namespace {

/// Writes poison_byte(salt, first + j) to out[j].
void poison_fill(std::uint64_t salt, std::uint64_t first, std::uint8_t* out, std::size_t n) {
  std::size_t j = 0;
  for (; j < n && (first + j) % 8 != 0; ++j) out[j] = poison_byte(salt, first + j);
  for (; j + 8 <= n; j += 8) {
    const std::uint64_t word = poison_word(salt, (first + j) / 8);
    std::memcpy(out + j, &word, 8);  // little-endian host: byte k of the word is byte 8w + k
  }
  for (; j < n; ++j) out[j] = poison_byte(salt, first + j);
}

/// Merges overlapping or touching ranges (sorted first).
std::vector<ByteRange> merge_ranges(std::vector<ByteRange> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<ByteRange> out;
  for (const ByteRange& r : ranges) {
    if (r.first >= r.second) continue;
    if (!out.empty() && r.first <= out.back().second) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace

ByteStorage::ByteStorage(std::vector<std::uint8_t> bytes)
    : size_(static_cast<std::int64_t>(bytes.size())), dense_(std::move(bytes)) {
  base_ = dense_.data();
}

ByteStorage ByteStorage::poisoned(std::int64_t size, std::uint64_t salt, bool allow_lazy) {
  if (allow_lazy && size >= kLazyStorageBytes) return lazy(size, salt);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  poison_fill(salt, 0, bytes.data(), bytes.size());
  ByteStorage s(std::move(bytes));
  s.salt_ = salt;
  return s;
}

ByteStorage ByteStorage::lazy(std::int64_t size, std::uint64_t salt) {
  ByteStorage s;
  s.lazy_ = true;
  s.salt_ = salt;
  s.size_ = size;
  if (size == 0) return s;
  void* p = mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    throw std::runtime_error("cannot reserve " + std::to_string(size) +
                             " bytes of address space for a lazy cache buffer");
  }
#ifdef MADV_NOHUGEPAGE
  madvise(p, static_cast<std::size_t>(size), MADV_NOHUGEPAGE);
#endif
  s.base_ = static_cast<std::uint8_t*>(p);
  s.page_flags_.assign(static_cast<std::size_t>((size + kPageBytes - 1) / kPageBytes), 0);
  return s;
}

void ByteStorage::release() {
  if (lazy_ && base_ != nullptr) munmap(base_, static_cast<std::size_t>(size_));
  base_ = nullptr;
  size_ = 0;
  lazy_ = false;
  dense_.clear();
  page_flags_.clear();
  held_pages_ = 0;
}

void ByteStorage::copy_from(const ByteStorage& other) {
  if (!other.lazy_) {
    dense_ = other.dense_;
    base_ = dense_.data();
    size_ = other.size_;
    salt_ = other.salt_;
    return;
  }
  *this = lazy(other.size_, other.salt_);
  for (const ByteRange& r : other.materialised()) {
    std::memcpy(base_ + r.first, other.base_ + r.first,
                static_cast<std::size_t>(r.second - r.first));
    for (std::int64_t p = r.first / kPageBytes; p * kPageBytes < r.second; ++p) {
      mark_materialised(p);
    }
  }
}

ByteStorage::ByteStorage(const ByteStorage& other) { copy_from(other); }

ByteStorage& ByteStorage::operator=(const ByteStorage& other) {
  if (this != &other) {
    release();
    copy_from(other);
  }
  return *this;
}

ByteStorage::ByteStorage(ByteStorage&& other) noexcept { *this = std::move(other); }

ByteStorage& ByteStorage::operator=(ByteStorage&& other) noexcept {
  if (this == &other) return *this;
  release();
  lazy_ = other.lazy_;
  size_ = other.size_;
  salt_ = other.salt_;
  may_stray_ = other.may_stray_;
  dense_ = std::move(other.dense_);
  page_flags_ = std::move(other.page_flags_);
  held_pages_ = other.held_pages_;
  base_ = lazy_ ? other.base_ : dense_.data();
  other.base_ = nullptr;
  other.size_ = 0;
  other.lazy_ = false;
  other.dense_.clear();
  other.page_flags_.clear();
  other.held_pages_ = 0;
  return *this;
}

ByteStorage::~ByteStorage() { release(); }

std::uint8_t ByteStorage::byte(std::int64_t i) const {
  if (lazy_ && !page_materialised(i / kPageBytes)) {
    return poison_byte(salt_, static_cast<std::uint64_t>(i));
  }
  return base_[i];
}

void ByteStorage::materialise(std::int64_t begin, std::int64_t end) {
  if (!lazy_) return;
  begin = std::max<std::int64_t>(begin, 0);
  end = std::min(end, size_);
  if (begin >= end) return;
  for (std::int64_t p = begin / kPageBytes; p * kPageBytes < end; ++p) {
    if (page_materialised(p)) continue;
    const std::int64_t at = p * kPageBytes;
    const auto n = static_cast<std::size_t>(std::min(kPageBytes, size_ - at));
    poison_fill(salt_, static_cast<std::uint64_t>(at), base_ + at, n);
    mark_materialised(p);
  }
}

void ByteStorage::store(std::int64_t begin, std::span<const std::uint8_t> bytes) {
  const auto end = begin + static_cast<std::int64_t>(bytes.size());
  if (begin < 0 || end > size_) throw std::out_of_range("ByteStorage::store past the storage");
  if (lazy_ && (begin % kPageBytes != 0 || (end % kPageBytes != 0 && end != size_))) {
    throw std::invalid_argument("ByteStorage::store of lazy storage takes whole pages");
  }
  std::memcpy(base_ + begin, bytes.data(), bytes.size());
  if (!lazy_) return;
  for (std::int64_t p = begin / kPageBytes; p * kPageBytes < end; ++p) {
    mark_materialised(p);
  }
}

namespace {

/// Calls f(i) for every i with flags[i] & mask, skipping zero words (a huge buffer's maps are
/// megabytes of zeros with a few set bytes).
template <class F>
void for_each_set(const std::vector<std::uint8_t>& flags, std::uint8_t mask, F&& f) {
  const std::size_t n = flags.size();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, flags.data() + i, 8);
    if ((word & (0x0101010101010101ull * mask)) == 0) continue;
    for (std::size_t j = i; j < i + 8; ++j) {
      if (flags[j] & mask) f(static_cast<std::int64_t>(j));
    }
  }
  for (; i < n; ++i) {
    if (flags[i] & mask) f(static_cast<std::int64_t>(i));
  }
}

}  // namespace

void ByteStorage::adopt_stray_pages() const {
  if (!lazy_ || size_ == 0 || !may_stray_) return;
  may_stray_ = false;
  const auto host_page = static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::uint8_t> resident(static_cast<std::size_t>((size_ + host_page - 1) / host_page));
  if (mincore(base_, static_cast<std::size_t>(size_), resident.data()) != 0) {
    throw std::runtime_error("mincore failed on a lazy cache buffer");
  }
  std::vector<std::int64_t> pages;   // resident, not materialised
  std::vector<ByteRange> unwritten;  // resident host pages of zeros, none of them materialised
  for_each_set(resident, 1, [&](std::int64_t hp) {
    const std::int64_t at = hp * host_page, end = std::min(at + host_page, size_);
    const std::int64_t first = at / kPageBytes, last = (end - 1) / kPageBytes;
    bool held = false;
    for (std::int64_t p = first; p <= last; ++p) held |= page_materialised(p);
    // A host page of zeros only was read, not written (a reader of the whole view maps the zero
    // page; a stray zero is the blind spot anyway): it still means poison, and is given back so
    // that neither this look nor the next one pays for it.
    if (!held && std::all_of(base_ + at, base_ + end, [](std::uint8_t b) { return b == 0; })) {
      if (!unwritten.empty() && unwritten.back().second == at) {
        unwritten.back().second = end;
      } else {
        unwritten.emplace_back(at, end);
      }
      return;
    }
    for (std::int64_t p = first; p <= last; ++p) {
      if (!page_materialised(p)) pages.push_back(p);
    }
  });
  for (const auto& [at, end] : unwritten)
    madvise(base_ + at, static_cast<std::size_t>(end - at), MADV_DONTNEED);
  for (const std::int64_t p : pages) {
    const std::int64_t at = p * kPageBytes;
    const std::int64_t end = std::min(at + kPageBytes, size_);
    for (std::int64_t i = at; i < end; ++i) {
      if (base_[i] == 0) base_[i] = poison_byte(salt_, static_cast<std::uint64_t>(i));
    }
    mark_materialised(p);
  }
}

bool ByteStorage::nothing_held() const {
  if (!lazy_) return false;
  adopt_stray_pages();
  return held_pages_ == 0;
}

std::vector<ByteRange> ByteStorage::materialised() const {
  if (!lazy_) return {{0, size_}};
  adopt_stray_pages();
  std::vector<ByteRange> out;
  for_each_set(page_flags_, 1, [&](std::int64_t p) {
    const std::int64_t at = p * kPageBytes, end = std::min(at + kPageBytes, size_);
    if (!out.empty() && out.back().second == at) {
      out.back().second = end;
    } else {
      out.emplace_back(at, end);
    }
  });
  return out;
}

std::vector<ByteRange> ByteStorage::compare_ranges(const ByteStorage& other) const {
  std::vector<ByteRange> all = materialised();
  for (const ByteRange& r : other.materialised()) all.push_back(r);
  return merge_ranges(std::move(all));
}

bool ByteStorage::same_as(const ByteStorage& other) const {
  if (size_ != other.size_) return false;
  if (!lazy_ && !other.lazy_) return dense_ == other.dense_;
  for (const ByteRange& r : compare_ranges(other)) {
    for (std::int64_t at = r.first; at < r.second;) {
      const std::int64_t end = std::min((at / kPageBytes + 1) * kPageBytes, r.second);
      const bool mine = !lazy_ || page_materialised(at / kPageBytes);
      const bool theirs = !other.lazy_ || other.page_materialised(at / kPageBytes);
      if (mine && theirs) {
        if (std::memcmp(base_ + at, other.base_ + at, static_cast<std::size_t>(end - at)) != 0) {
          return false;
        }
      } else {
        for (std::int64_t i = at; i < end; ++i) {
          if (byte(i) != other.byte(i)) return false;
        }
      }
      at = end;
    }
  }
  return true;
}

namespace {

/// The first whitespace-separated number of a file (or after `key` on a line of it), or nothing
/// ("max", an unreadable file).
std::optional<std::int64_t> read_number(const char* path, const std::string& key = {}) {
  std::ifstream in(path);
  std::string word;
  if (!key.empty()) {
    while (in >> word && word != key) {
    }
  }
  std::int64_t value = 0;
  if (!(in >> value) || value < 0) return std::nullopt;
  return value;
}

}  // namespace

std::optional<HostMemory> host_memory_available() {
  if (const char* forced = std::getenv("KVO_HOST_MEMORY_BYTES")) {
    char* end = nullptr;
    const long long v = std::strtoll(forced, &end, 10);
    if (end == forced || *end != '\0' || v < 0) {
      throw InvalidInput("KVO_HOST_MEMORY_BYTES", -1, forced, "expected a count of bytes");
    }
    return HostMemory{v, "KVO_HOST_MEMORY_BYTES"};
  }
  std::optional<HostMemory> best;
  const auto consider = [&](std::optional<std::int64_t> bytes, const char* source) {
    if (bytes && (!best || *bytes < best->bytes)) best = HostMemory{*bytes, source};
  };
  if (const auto kib = read_number("/proc/meminfo", "MemAvailable:"))
    consider(*kib * 1024, "MemAvailable");
  const auto room = [](std::optional<std::int64_t> limit,
                       std::optional<std::int64_t> used) -> std::optional<std::int64_t> {
    if (!limit || !used) return std::nullopt;
    return std::max<std::int64_t>(0, *limit - *used);
  };
  consider(
      room(read_number("/sys/fs/cgroup/memory.max"), read_number("/sys/fs/cgroup/memory.current")),
      "cgroup memory.max");
  consider(room(read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes")),
           "cgroup memory.limit_in_bytes");
  return best;
}

}  // namespace kvo::spec

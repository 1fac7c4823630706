#pragma once
/// \file cache_storage.hpp
/// The bytes of one guarded cache buffer (SPEC 3: "allocated with guard bands before and after it
/// and poisoned with a known pattern"), and that pattern.
///
/// A buffer is held one of two ways, with one interface:
/// - dense: every byte in memory (any buffer below kLazyStorageBytes);
/// - lazy (huge caches, issue 14): the whole range reserved as virtual memory that costs nothing
///   until touched, and only the pages a case touches materialised (poisoned on demand,
///   `materialise`). An unmaterialised byte *means* its poison byte: `byte(i)` answers it without
///   touching the page. A writer that stores into a page nobody materialised leaves that page
///   resident, which `stray_pages` finds (the kernel's own page tables, `mincore`), so a stray
///   write anywhere in a 2^33-byte buffer is still seen without reading 2^33 bytes.
/// Both forms hand writers a plain pointer (`data()`) to the whole range, so every CPU writer, the
/// reference and NumPy views address a huge buffer exactly as a small one.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#define KVO_HOST_DEVICE __host__ __device__
#else
#define KVO_HOST_DEVICE
#endif

namespace kvo::spec {

/// The poison word w of a buffer poisoned with `salt`: bytes 8w..8w+7, little-endian (a fixed
/// hash, so a missed or stray write shows whatever the written value is, with probability 255/256
/// per byte). Host and device compute it alike (the GPU mirror poisons a huge buffer on the
/// device).
KVO_HOST_DEVICE constexpr std::uint64_t poison_word(std::uint64_t salt, std::uint64_t w) {
  std::uint64_t z = salt + (w + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
/// The poison byte at storage index i.
KVO_HOST_DEVICE constexpr std::uint8_t poison_byte(std::uint64_t salt, std::uint64_t i) {
  return static_cast<std::uint8_t>(poison_word(salt, i / 8) >> (8 * (i % 8)));
}
/// Storage at or above this many bytes is lazy (64 MiB: a random case's ordinary buffers stay
/// far below it; huge cases, long traces and production geometries pass it).
inline constexpr std::int64_t kLazyStorageBytes = std::int64_t{1} << 26;

/// A byte range [begin, end).
using ByteRange = std::pair<std::int64_t, std::int64_t>;

/// Host memory a run may still take, and where the figure comes from.
struct HostMemory {
  std::int64_t bytes = 0;
  std::string source;  ///< "MemAvailable", "cgroup memory.max", "KVO_HOST_MEMORY_BYTES"
};
/// The host memory this process may still take (issue 15: a run that cannot fit says so before
/// it starts): the smaller of /proc/meminfo's MemAvailable and the room under the cgroup's
/// memory.max (v2) or memory.limit_in_bytes (v1); KVO_HOST_MEMORY_BYTES (a count of bytes)
/// overrides both. Nothing when none of them can be read.
std::optional<HostMemory> host_memory_available();

class ByteStorage {
 public:
  /// Materialisation granularity of lazy storage: 4 KiB pages (a multiple of the host page size
  /// is not needed: residency is asked per host page and mapped onto these).
  static constexpr std::int64_t kPageBytes = 4096;

  ByteStorage() = default;
  /// Dense storage holding `bytes`.
  explicit ByteStorage(std::vector<std::uint8_t> bytes);
  /// `size` bytes poisoned with `salt`: dense below kLazyStorageBytes (or when !allow_lazy), lazy
  /// at or above it.
  static ByteStorage poisoned(std::int64_t size, std::uint64_t salt, bool allow_lazy = true);
  /// Lazy storage whatever the size (tests of the lazy form use small ones).
  static ByteStorage lazy(std::int64_t size, std::uint64_t salt);

  ByteStorage(const ByteStorage& other);
  ByteStorage& operator=(const ByteStorage& other);
  ByteStorage(ByteStorage&& other) noexcept;
  ByteStorage& operator=(ByteStorage&& other) noexcept;
  ~ByteStorage();

  /// The raw bytes (a lazy buffer's unmaterialised bytes read 0 here: `byte` says what they mean).
  /// Handing out a writable pointer is what lets a writer stray: the next `materialised` looks.
  std::uint8_t& operator[](std::size_t i) {
    may_stray_ = true;
    return base_[i];
  }
  const std::uint8_t& operator[](std::size_t i) const { return base_[i]; }
  std::uint8_t* data() {
    may_stray_ = true;
    return base_;
  }
  const std::uint8_t* data() const { return base_; }
  std::int64_t size() const { return size_; }
  bool is_lazy() const { return lazy_; }
  std::uint64_t salt() const { return salt_; }

  /// Byte i as the buffer means it: an unmaterialised byte of lazy storage is its poison byte (its
  /// page is not touched). i in [0, size).
  std::uint8_t byte(std::int64_t i) const;

  /// Lazy: poisons every not yet materialised page overlapping [begin, end) (clamped to the
  /// storage). Dense: nothing to do.
  void materialise(std::int64_t begin, std::int64_t end);
  /// Lazy: copies `bytes` (whole pages' worth, from page-aligned `begin`) in and marks the pages
  /// materialised (the GPU mirror's download of a page it found changed). Dense: a plain copy.
  void store(std::int64_t begin, std::span<const std::uint8_t> bytes);
  /// The materialised ranges, ascending and disjoint (dense: the whole storage). Lazy storage
  /// adopts stray pages first: the pages someone wrote without their being materialised (resident,
  /// never materialised) become materialised, each zero byte in them replaced by its poison. A
  /// fresh page reads zero, so a zero there was never written; what a stray write left shows
  /// against the poison like any other byte. (Blind spot, on the host only: a stray write of zero
  /// bytes. The GPU mirror downloads a changed page whole, poison included, and `store`s it.)
  std::vector<ByteRange> materialised() const;
  /// Lazy storage that holds no page (stray pages adopted first, as `materialised` does): every
  /// byte means its poison. Without scanning the page map (a huge cache's is megabytes). Dense:
  /// false.
  bool nothing_held() const;
  /// Lazy storage: the pages materialised so far (a count kept as pages are flagged; stray pages
  /// not looked for). Dense: 0.
  std::int64_t flagged_pages() const { return lazy_ ? held_pages_ : 0; }
  /// The ranges a comparison of this storage with `other` must read: both sides' materialised
  /// ranges, merged. Everything else is poison on both sides.
  std::vector<ByteRange> compare_ranges(const ByteStorage& other) const;
  /// Equal as the buffers mean it (same size; byte(i) equal for every i).
  bool same_as(const ByteStorage& other) const;
  bool operator==(const ByteStorage& other) const { return same_as(other); }

 private:
  void release();
  void copy_from(const ByteStorage& other);
  /// The stray-page adoption of `materialised` (logically const: what the storage means does not
  /// change); looks only after a writable pointer went out.
  void adopt_stray_pages() const;
  bool page_materialised(std::int64_t page) const {
    return page_flags_[static_cast<std::size_t>(page)] != 0;
  }
  void mark_materialised(std::int64_t page) const {
    std::uint8_t& f = page_flags_[static_cast<std::size_t>(page)];
    held_pages_ += f == 0 ? 1 : 0;
    f = 1;
  }

  std::uint8_t* base_ = nullptr;
  std::int64_t size_ = 0;
  bool lazy_ = false;
  std::uint64_t salt_ = 0;
  std::vector<std::uint8_t> dense_;               ///< dense form
  mutable std::vector<std::uint8_t> page_flags_;  ///< lazy form: 1 per materialised page
  mutable std::int64_t held_pages_ = 0;           ///< lazy form: the pages flagged
  /// Whether a writable pointer went out since the last look for stray pages.
  mutable bool may_stray_ = false;
};

}  // namespace kvo::spec

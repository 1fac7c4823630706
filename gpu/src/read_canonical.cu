// The read side on the GPU, in the canonical order of SPEC 5-6. Correct first: each kernel follows
// the spec's sequence of float32 operations exactly (8-wide fma groups then a power-of-two tree for
// dots, the polynomial exp, chunk maxima, tree sums and fma chains in ascending token order), so
// its results are the reference's bits. Parallelism is over what the spec leaves independent: query
// rows, heads, logical blocks (indexer), tokens of a chunk (scores) and output dims (attention).
//
// Canonical order, indexer (one CUDA block per query row and KV head): thread j computes the group
// score of logical block j: for each index head of the group (ascending), the first maximum over
// the block's visible tokens (ascending) of dot(iq, ik), -1e30 if any is NaN; group maximum by `>`;
// forcing (init 1e30, then local 1e29). Thread 0 then selects k_eff blocks by (score desc, id asc)
// and writes them ascending.
// Canonical order, attention (one CUDA block per query row and query head): per selected logical
// block ascending: s_i = fl(dot(q, k_i) * sm) (thread i), m = first max (thread 0, ascending),
// p_i = exp(s_i - m) (thread i), l = tree_sum over the block's sparse_block positions, o[d] = fma
// chain over tokens ascending (thread d); combined with the running (M, L, O) as SPEC 6.3 says.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvo/gpu/read.hpp"
#include "kvo/gpu/write.hpp"
#include "kvo/spec/outcome.hpp"
#include "launch.cuh"

namespace kvo::gpu {
namespace {

using detail::check_cuda;

constexpr int kMaxDim = 1024;          // head_dim and index_dim: 128 dot groups at most
constexpr int kMaxSparseBlock = 1024;  // tokens of one logical block (shared arrays)
constexpr int kMaxTopk = 1024;
constexpr int kThreads = 256;

/// Plain description of a layer's caches and inputs for the kernels.
struct ReadGeom {
  long long num_blocks, block_size, nkv, head_dim, index_dim, max_blocks;
  int layout, kv_dtype, act_dtype, index_layout, index_dtype;
  int scale_none, per_head_scale;
};

__device__ unsigned load_le(const unsigned char* p, int bytes) {
  unsigned v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<unsigned>(p[i]) << (8 * i);
  return v;
}

/// fp8 code -> float, exact; NaN codes give 0x7FFFFFFF (SPEC 2 / fp8_spec.md 3).
__device__ float fp8_value(unsigned code, bool e5m2) {
  const bool neg = (code & 0x80u) != 0;
  float mag;
  if (!e5m2) {
    const unsigned e = (code >> 3) & 15u, m = code & 7u;
    if (e == 15u && m == 7u) return __uint_as_float(0x7FFFFFFFu);
    mag = e == 0 ? __fmul_rn(static_cast<float>(m), 0x1p-9f)
                 : __uint_as_float(((e + 120u) << 23) | (m << 20));
  } else {
    const unsigned e = (code >> 2) & 31u, m = code & 3u;
    if (e == 31u) {
      if (m != 0) return __uint_as_float(0x7FFFFFFFu);
      mag = __uint_as_float(0x7F800000u);
    } else {
      mag = e == 0 ? __fmul_rn(static_cast<float>(m), 0x1p-16f)
                   : __uint_as_float(((e + 112u) << 23) | (m << 21));
    }
  }
  return neg ? -mag : mag;
}

/// One element of dtype `dt` (spec::DType order: f32, bf16, fp16, e4m3, e5m2) at p -> float.
__device__ float element(const unsigned char* p, int dt) {
  switch (dt) {
    case 0:
      return __uint_as_float(load_le(p, 4));
    case 1:
      return __uint_as_float(load_le(p, 2) << 16);
    case 2:
      return __half2float(__ushort_as_half(static_cast<unsigned short>(load_le(p, 2))));
    default:
      return fp8_value(load_le(p, 1), dt == 4);
  }
}

__device__ int dtype_bytes(int dt) { return dt == 0 ? 4 : dt <= 2 ? 2 : 1; }

/// SPEC 3 element offset of K (kv 0) or V (kv 1) in this layout (spec::KvLayout order).
__device__ long long kv_offset(const ReadGeom& g, int kv, long long b, long long o, long long h,
                               long long d) {
  const long long bs = g.block_size, nkv = g.nkv, hd = g.head_dim;
  switch (g.layout) {
    case 0:
      return ((b * bs + o) * nkv + h) * hd + d;
    case 1:
      return ((b * nkv + h) * bs + o) * hd + d;
    case 2:
      return ((b * nkv + h) * bs + o) * (2 * hd) + kv * hd + d;
    case 3:
      return ((b * bs + o) * nkv + h) * (2 * hd) + kv * hd + d;
    case 4:
      return (((b * 2 + kv) * bs + o) * nkv + h) * hd + d;
    default:
      return (((b * 2 + kv) * nkv + h) * bs + o) * hd + d;
  }
}

/// SPEC 6.1 tree sum of x[0..n) in place (x has room for the next power of two, zero padded).
__device__ float tree_sum_serial(float* x, int n) {
  int m = 1;
  while (m < n) m *= 2;
  for (int i = n; i < m; ++i) x[i] = 0.0f;
  while (m > 1) {
    m /= 2;
    for (int i = 0; i < m; ++i) x[i] = __fadd_rn(x[i], x[i + m]);
  }
  return x[0];
}

/// SPEC 6.1 dot: 8-element fma groups, then the tree over the group results. `a` and `b` are
/// functors returning element i as float.
template <class A, class B>
__device__ float canonical_dot(A a, B b, int n) {
  float partial[kMaxDim / 8];
  const int groups = n / 8;
  for (int g = 0; g < groups; ++g) {
    float acc = 0.0f;
    for (int i = 8 * g; i < 8 * g + 8; ++i) acc = __fmaf_rn(a(i), b(i), acc);
    partial[g] = acc;
  }
  return tree_sum_serial(partial, groups);
}

/// SPEC 6.2 exp2 and exp, with the spec's polynomial (never the special-function unit).
__device__ float canonical_exp2(float y) {
  if (isnan(y)) return y;
  if (y < -126.0f) return 0.0f;
  if (y > 127.0f) return __uint_as_float(0x7F800000u);
  const float n = rintf(y);  // round half to even
  const float f = __fsub_rn(y, n);
  const unsigned c[8] = {0x3F800000u, 0x3F317218u, 0x3E75FDF0u, 0x3D635847u,
                         0x3C1D955Bu, 0x3AAEC3FFu, 0x39218489u, 0x377FE5FEu};
  float p = __uint_as_float(c[7]);
  for (int k = 6; k >= 0; --k) p = __fmaf_rn(p, f, __uint_as_float(c[k]));
  return __fmul_rn(p, __uint_as_float(static_cast<unsigned>(static_cast<int>(n) + 127) << 23));
}
__device__ float canonical_exp(float x) {
  return canonical_exp2(__fmul_rn(x, __uint_as_float(0x3FB8AA3Bu)));
}

/// Index-K element d of token t of request r, dequantized (flat: plain decode; blockscale: fp8
/// times its group's fp32 scale).
__device__ float index_k(const ReadGeom& g, const unsigned char* cache, const int* table,
                         long long r, long long t, long long d) {
  const long long b = table[r * g.max_blocks + t / g.block_size], o = t % g.block_size;
  if (g.index_layout == 0) {
    const int eb = dtype_bytes(g.index_dtype);
    return element(cache + ((b * g.block_size + o) * g.index_dim + d) * eb, g.index_dtype);
  }
  const long long groups = g.index_dim / 128;
  const long long block_bytes = g.block_size * g.index_dim + g.block_size * groups * 4;
  const unsigned char* blk = cache + b * block_bytes;
  const float s =
      __uint_as_float(load_le(blk + g.block_size * g.index_dim + (o * groups + d / 128) * 4, 4));
  return __fmul_rn(fp8_value(blk[o * g.index_dim + d], false), s);
}

__global__ void indexer_kernel(ReadGeom g, const unsigned char* index_cache, const int* table,
                               const long long* row_req, const long long* row_pos,
                               const long long* seq_lens, const unsigned char* index_q,
                               int n_idx_heads, long long sb, long long topk, long long init_blocks,
                               long long local_blocks, long long max_nvalid, float* scores,
                               int* out) {
  const long long q = blockIdx.x, grp = blockIdx.y;
  const long long r = row_req[q], pos = row_pos[q];
  int* row_out = out + (q * g.nkv + grp) * topk;
  if (seq_lens[r] == 0) {
    for (long long k = threadIdx.x; k < topk; k += blockDim.x) row_out[k] = -1;
    return;
  }
  const long long n_valid = pos / sb + 1;
  const int per_group = static_cast<int>(n_idx_heads / g.nkv);
  const int ab = dtype_bytes(g.act_dtype);
  float* row_scores = scores + (q * g.nkv + grp) * max_nvalid;
  for (long long j = threadIdx.x; j < n_valid; j += blockDim.x) {
    float gs = 0.0f;
    for (int h = static_cast<int>(grp) * per_group; h < (static_cast<int>(grp) + 1) * per_group;
         ++h) {
      const unsigned char* iq = index_q + ((q * n_idx_heads + h) * g.index_dim) * ab;
      float best = 0.0f;
      bool any = false, nan = false;
      for (long long t = j * sb; t < (j + 1) * sb && t <= pos; ++t) {
        const float s = canonical_dot(
            [&](int i) { return element(iq + static_cast<long long>(i) * ab, g.act_dtype); },
            [&](int i) { return index_k(g, index_cache, table, r, t, i); },
            static_cast<int>(g.index_dim));
        nan |= isnan(s);
        if (!any || s > best) best = s;
        any = true;
      }
      if (nan) best = -1e30f;
      if (h == static_cast<int>(grp) * per_group || best > gs) gs = best;
    }
    if (j < init_blocks) gs = 1e30f;
    if (j >= n_valid - local_blocks) gs = 1e29f;  // local overrides init
    row_scores[j] = gs;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  // k_eff selections by (score descending, id ascending): each pick is the best block ranked after
  // the previous pick.
  const long long k_eff = topk < n_valid ? topk : n_valid;
  float prev_s = 0.0f;
  long long prev_id = -1;
  for (long long k = 0; k < k_eff; ++k) {
    long long best = -1;
    for (long long j = 0; j < n_valid; ++j) {
      const float s = row_scores[j];
      if (prev_id >= 0 && !(s < prev_s || (s == prev_s && j > prev_id))) continue;
      if (best < 0 || s > row_scores[best]) best = j;  // ties keep the lower id
    }
    row_out[k] = static_cast<int>(best);
    prev_s = row_scores[best];
    prev_id = best;
  }
  for (long long a = 1; a < k_eff; ++a) {  // ascending ids (insertion sort)
    const int v = row_out[a];
    long long b = a - 1;
    while (b >= 0 && row_out[b] > v) {
      row_out[b + 1] = row_out[b];
      --b;
    }
    row_out[b + 1] = v;
  }
  for (long long k = k_eff; k < topk; ++k) row_out[k] = -1;
}

/// K (kv 0) or V (kv 1) element d of token t of request r, head h, dequantized.
__device__ float kv_value(const ReadGeom& g, const unsigned char* buf, const int* table,
                          const float* scales, int kv, long long r, long long t, long long h,
                          long long d) {
  const long long b = table[r * g.max_blocks + t / g.block_size], o = t % g.block_size;
  const int eb = dtype_bytes(g.kv_dtype);
  const float x = element(buf + kv_offset(g, kv, b, o, h, d) * eb, g.kv_dtype);
  return g.scale_none ? x : __fmul_rn(x, scales[g.per_head_scale ? h : 0]);
}

__global__ void attention_kernel(ReadGeom g, const unsigned char* k_buf, const unsigned char* v_buf,
                                 const int* table, const long long* row_req,
                                 const long long* row_pos, const long long* seq_lens,
                                 const unsigned char* q_in, int nq, const float* k_scale,
                                 const float* v_scale, const int* selection, long long topk,
                                 long long sb, float sm, int out_dtype, unsigned char* out) {
  __shared__ float s[kMaxSparseBlock];
  __shared__ float p[kMaxSparseBlock];
  __shared__ float tree[kMaxSparseBlock];
  __shared__ int chunks[kMaxTopk];
  __shared__ float chunk_max;
  __shared__ int n_chunks;
  const long long qi = blockIdx.x, hq = blockIdx.y;
  const long long r = row_req[qi], pos = row_pos[qi];
  const long long hd = g.head_dim, group = nq / g.nkv, kvh = hq / group;
  const int ab = dtype_bytes(g.act_dtype);
  const unsigned char* qrow = q_in + ((qi * nq + hq) * hd) * ab;
  const long long n_valid = seq_lens[r] == 0 ? 0 : pos / sb + 1;
  if (threadIdx.x == 0) {
    // The chunks, ascending: every visible block (dense) or the selected ones.
    int n = 0;
    if (selection == nullptr) {
      for (long long j = 0; j < n_valid; ++j) chunks[n++] = static_cast<int>(j);
    } else {
      for (long long k = 0; k < topk; ++k) {
        const int id = selection[(qi * g.nkv + kvh) * topk + k];
        if (id < 0) continue;
        int at = n++;
        while (at > 0 && chunks[at - 1] > id) {
          chunks[at] = chunks[at - 1];
          --at;
        }
        chunks[at] = id;
      }
    }
    n_chunks = seq_lens[r] == 0 ? 0 : n;
  }
  __syncthreads();
  float big_m = 0.0f, big_l = 0.0f, big_o = 0.0f;  // big_o: dim threadIdx.x
  bool started = false;
  const long long d = threadIdx.x;
  for (int c = 0; c < n_chunks; ++c) {
    const long long j = chunks[c];
    const long long valid = pos - j * sb + 1 < sb ? pos - j * sb + 1 : sb;
    if (valid <= 0) continue;  // nothing of this block is visible: it contributes nothing (uniform)
    for (long long i = threadIdx.x; i < valid; i += blockDim.x) {
      const long long t = j * sb + i;
      const float dot = canonical_dot(
          [&](int e) { return element(qrow + static_cast<long long>(e) * ab, g.act_dtype); },
          [&](int e) { return kv_value(g, k_buf, table, k_scale, 0, r, t, kvh, e); },
          static_cast<int>(hd));
      s[i] = __fmul_rn(dot, sm);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = -INFINITY;
      for (long long i = 0; i < valid; ++i)
        if (s[i] > m) m = s[i];
      chunk_max = m;
    }
    __syncthreads();
    const float m = chunk_max;
    for (long long i = threadIdx.x; i < sb; i += blockDim.x) {
      p[i] = i < valid ? canonical_exp(__fsub_rn(s[i], m)) : 0.0f;  // masked positions: +0
      tree[i] = p[i];
    }
    __syncthreads();
    // l = tree_sum over the sb positions: levels in parallel, each level's additions independent.
    int width = 1;
    while (width < sb) width *= 2;
    for (long long i = sb + threadIdx.x; i < width; i += blockDim.x) tree[i] = 0.0f;
    __syncthreads();
    while (width > 1) {
      width /= 2;
      for (int i = threadIdx.x; i < width; i += blockDim.x)
        tree[i] = __fadd_rn(tree[i], tree[i + width]);
      __syncthreads();
    }
    const float l = tree[0];
    float o = 0.0f;
    if (d < hd) {
      for (long long i = 0; i < valid; ++i)
        o = __fmaf_rn(p[i], kv_value(g, v_buf, table, v_scale, 1, r, j * sb + i, kvh, d), o);
    }
    if (!started) {
      big_m = m;
      big_l = l;
      big_o = o;
      started = true;
    } else {
      const float m_new = m > big_m ? m : big_m;
      const float a = canonical_exp(__fsub_rn(big_m, m_new));
      const float b = canonical_exp(__fsub_rn(m, m_new));
      big_l = __fmaf_rn(big_l, a, __fmul_rn(l, b));
      big_o = __fmaf_rn(big_o, a, __fmul_rn(o, b));
      big_m = m_new;
    }
    __syncthreads();  // s, p and tree are reused by the next chunk
  }
  if (d >= hd) return;
  const float y = started ? __fdiv_rn(big_o, big_l) : 0.0f;
  unsigned char* dst = out + ((qi * nq + hq) * hd + d) * dtype_bytes(out_dtype);
  unsigned code;
  if (out_dtype == 0) {
    code = __float_as_uint(y);
  } else if (out_dtype == 1) {
    code = isnan(y) ? 0x7FFFu : __bfloat16_as_ushort(__float2bfloat16_rn(y));
  } else {
    code = isnan(y) ? 0x7FFFu : __half_as_ushort(__float2half_rn(y));
  }
  for (int i = 0; i < dtype_bytes(out_dtype); ++i)
    dst[i] = static_cast<unsigned char>(code >> (8 * i));
}

/// A device copy of a host vector, freed on scope exit.
template <class T>
struct Dev {
  T* ptr = nullptr;
  Dev() = default;
  explicit Dev(std::size_t n) {
    if (n) check_cuda(cudaMalloc(&ptr, n * sizeof(T)), "cudaMalloc");
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    if (!v.empty())
      check_cuda(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
                 "cudaMemcpy");
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() {
    if (ptr) cudaFree(ptr);
  }
};

const spec::CacheBuffer& buffer(const spec::LayerCaches& c, spec::BufferKind k) {
  const spec::CacheBuffer* b = c.find(k);
  if (b == nullptr)
    throw spec::InvalidInput("caches", -1, std::string(spec::name_of(k)),
                             "the layer has no such buffer");
  return *b;
}

std::vector<unsigned char> body(const spec::CacheBuffer& b) {
  return {b.storage.begin() + b.guard_bytes, b.storage.begin() + b.guard_bytes + b.body_bytes()};
}

void check_tensor(const spec::HostTensor& t, const char* field, spec::DType dt, std::int64_t rows,
                  std::int64_t heads, std::int64_t dim) {
  if (t.dtype != dt || t.shape != std::vector<std::int64_t>{rows, heads, dim} ||
      static_cast<std::int64_t>(t.bytes.size()) !=
          rows * heads * dim * static_cast<std::int64_t>(spec::dtype_bytes(dt))) {
    throw spec::InvalidInput(field, -1, "tensor",
                             "expected " + std::string(spec::name_of(dt)) + " [" +
                                 std::to_string(rows) + ", " + std::to_string(heads) + ", " +
                                 std::to_string(dim) + "]");
  }
}

/// Query rows (request, position) of a validated batch, and the geometry for the kernels.
struct Prepared {
  ReadGeom g{};
  std::vector<long long> req, pos, seq;
  std::vector<int> table;
};

Prepared prepare(const spec::ModelConfig& c, const spec::ReadBatch& b) {
  spec::validate_batch(c, b);
  Prepared pr;
  pr.g = {c.geometry.num_blocks,
          c.geometry.block_size,
          c.geometry.num_kv_heads,
          c.geometry.head_dim,
          c.geometry.index_dim,
          b.max_blocks,
          static_cast<int>(c.layout),
          static_cast<int>(c.kv.cache_dtype),
          static_cast<int>(c.act_dtype),
          static_cast<int>(c.index.layout),
          static_cast<int>(c.index.flat_dtype),
          c.kv.scale_mode == spec::ScaleMode::kNone ? 1 : 0,
          c.kv.per_head_scale ? 1 : 0};
  for (std::int64_t r = 0; r < b.num_requests(); ++r) {
    const std::int64_t q_len = b.query_start_loc[static_cast<std::size_t>(r + 1)] -
                               b.query_start_loc[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < q_len; ++j) {
      pr.req.push_back(r);
      pr.pos.push_back(b.seq_lens[static_cast<std::size_t>(r)] - q_len + j);
    }
  }
  pr.seq.assign(b.seq_lens.begin(), b.seq_lens.end());
  // Unused table entries (-1) are never read: validate_batch checked the ones a request reads.
  pr.table.assign(b.block_table.begin(), b.block_table.end());
  if (c.geometry.head_dim > kMaxDim || c.geometry.index_dim > kMaxDim) {
    throw spec::Unsupported("head_dim and index_dim above " + std::to_string(kMaxDim));
  }
  return pr;
}

}  // namespace

std::vector<std::int32_t> indexer_topk_host(const spec::ModelConfig& c,
                                            const spec::IndexerParams& p, const spec::ReadBatch& b,
                                            const spec::HostTensor& index_q,
                                            const spec::LayerCaches& caches) {
  Prepared pr = prepare(c, b);
  spec::validate_indexer(c, p);
  const auto tq = static_cast<std::int64_t>(pr.req.size());
  check_tensor(index_q, "index_q", c.act_dtype, tq, p.num_index_heads, c.geometry.index_dim);
  const spec::CacheBuffer& ib = buffer(caches, spec::BufferKind::kIndexK);
  if (ib.body_bytes() != index_buffer_bytes(c))
    throw spec::InvalidInput("caches", -1, "index_k", "wrong buffer size");
  if (p.topk > kMaxTopk) throw spec::Unsupported("topk above " + std::to_string(kMaxTopk));
  std::int64_t max_nvalid = 1;
  for (std::int64_t pos : pr.pos) max_nvalid = std::max(max_nvalid, pos / p.sparse_block + 1);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tq * c.geometry.num_kv_heads * p.topk),
                                -1);
  if (tq == 0) return ids;
  Dev<unsigned char> d_cache(body(ib)), d_q(index_q.bytes);
  Dev<int> d_table(pr.table), d_out(ids.size());
  Dev<long long> d_req(pr.req), d_pos(pr.pos), d_seq(pr.seq);
  Dev<float> d_scores(static_cast<std::size_t>(tq * c.geometry.num_kv_heads * max_nvalid));
  indexer_kernel<<<dim3(static_cast<unsigned>(tq), static_cast<unsigned>(c.geometry.num_kv_heads)),
                   kThreads>>>(pr.g, d_cache.ptr, d_table.ptr, d_req.ptr, d_pos.ptr, d_seq.ptr,
                               d_q.ptr, static_cast<int>(p.num_index_heads), p.sparse_block, p.topk,
                               p.init_blocks, p.local_blocks, max_nvalid, d_scores.ptr, d_out.ptr);
  check_cuda(cudaGetLastError(), "indexer_kernel launch");
  check_cuda(cudaMemcpy(ids.data(), d_out.ptr, ids.size() * sizeof(int), cudaMemcpyDeviceToHost),
             "indexer_kernel");
  return ids;
}

spec::HostTensor attention_host(const spec::ModelConfig& c, const spec::AttentionParams& p,
                                const spec::ReadBatch& b, const spec::HostTensor& q,
                                const spec::LayerCaches& caches, const std::vector<float>& k_scale,
                                const std::vector<float>& v_scale,
                                const std::vector<std::int32_t>& selection, std::int64_t topk) {
  Prepared pr = prepare(c, b);
  spec::validate_attention(c, p);
  spec::validate_scales(c, k_scale, "k_scale");
  spec::validate_scales(c, v_scale, "v_scale");
  const auto tq = static_cast<std::int64_t>(pr.req.size());
  const std::int64_t nkv = c.geometry.num_kv_heads, hd = c.geometry.head_dim;
  check_tensor(q, "q", c.act_dtype, tq, p.num_q_heads, hd);
  if (p.sparse_block > kMaxSparseBlock)
    throw spec::Unsupported("sparse_block above " + std::to_string(kMaxSparseBlock));
  if (hd > kThreads) throw spec::Unsupported("head_dim above " + std::to_string(kThreads));
  if (!selection.empty()) {
    if (topk < 1 || topk > kMaxTopk ||
        static_cast<std::int64_t>(selection.size()) != tq * nkv * topk) {
      throw spec::InvalidInput("selection", -1, std::to_string(selection.size()) + " ids",
                               "expected [" + std::to_string(tq) + ", " + std::to_string(nkv) +
                                   ", topk <= " + std::to_string(kMaxTopk) + "]");
    }
    for (std::int64_t qi = 0; qi < tq; ++qi) {
      const std::int64_t n_valid =
          b.seq_lens[static_cast<std::size_t>(pr.req[static_cast<std::size_t>(qi)])] == 0
              ? 0
              : pr.pos[static_cast<std::size_t>(qi)] / p.sparse_block + 1;
      for (std::int64_t g = 0; g < nkv; ++g) {
        for (std::int64_t k = 0; k < topk; ++k) {
          const std::int64_t at = (qi * nkv + g) * topk + k;
          const std::int32_t id = selection[static_cast<std::size_t>(at)];
          bool dup = false;
          for (std::int64_t k2 = 0; k2 < k; ++k2)
            dup |= id >= 0 && selection[static_cast<std::size_t>((qi * nkv + g) * topk + k2)] == id;
          if (id >= 0 && (id >= n_valid || dup)) {
            throw spec::InvalidInput(
                "selection", at, std::to_string(id),
                "a duplicate or a block past n_valid = " + std::to_string(n_valid));
          }
        }
      }
    }
  }
  const bool one_tensor = spec::kv_in_one_tensor(c.layout);
  const spec::CacheBuffer& kb =
      buffer(caches, one_tensor ? spec::BufferKind::kKv : spec::BufferKind::kK);
  if (kb.body_bytes() != kv_buffer_bytes(c))
    throw spec::InvalidInput("caches", -1, "k", "wrong buffer size");
  spec::HostTensor out;
  out.dtype = p.out_dtype;
  out.shape = {tq, p.num_q_heads, hd};
  out.bytes.assign(static_cast<std::size_t>(out.numel()) * spec::dtype_bytes(p.out_dtype), 0);
  if (tq == 0) return out;
  Dev<unsigned char> d_k(body(kb)), d_q(q.bytes), d_out(out.bytes.size());
  Dev<unsigned char> d_v_separate;
  const unsigned char* v_ptr = d_k.ptr;
  std::vector<unsigned char> v_host;
  if (!one_tensor) {
    const spec::CacheBuffer& vb = buffer(caches, spec::BufferKind::kV);
    if (vb.body_bytes() != kv_buffer_bytes(c))
      throw spec::InvalidInput("caches", -1, "v", "wrong buffer size");
    v_host = body(vb);
  }
  Dev<unsigned char> d_v(v_host);
  if (!one_tensor) v_ptr = d_v.ptr;
  Dev<int> d_table(pr.table), d_sel(selection);
  Dev<long long> d_req(pr.req), d_pos(pr.pos), d_seq(pr.seq);
  Dev<float> d_ks(k_scale), d_vs(v_scale);
  // The default scale fl(1 / fl(sqrt(hd))), on the host in IEEE arithmetic.
  const float root = std::sqrt(static_cast<float>(hd));
  const float sm = p.sm_scale > 0.0f ? p.sm_scale : 1.0f / root;
  attention_kernel<<<dim3(static_cast<unsigned>(tq), static_cast<unsigned>(p.num_q_heads)),
                     kThreads>>>(pr.g, d_k.ptr, v_ptr, d_table.ptr, d_req.ptr, d_pos.ptr, d_seq.ptr,
                                 d_q.ptr, static_cast<int>(p.num_q_heads), d_ks.ptr, d_vs.ptr,
                                 selection.empty() ? nullptr : d_sel.ptr, topk, p.sparse_block, sm,
                                 static_cast<int>(p.out_dtype), d_out.ptr);
  check_cuda(cudaGetLastError(), "attention_kernel launch");
  check_cuda(cudaMemcpy(out.bytes.data(), d_out.ptr, out.bytes.size(), cudaMemcpyDeviceToHost),
             "attention_kernel");
  return out;
}

}  // namespace kvo::gpu

// Part of decoder_impl.h (included from it only, after decoder_impl_vector.h, once per copy):
// RoPE, and the attention over the KV caches, of one token (store_kv, attend_heads: a decode
// step) and of many query rows (rope_queries, attend_rows: a prompt's prefill).

namespace qlinear::decoder::QLINEAR_DECODER_IMPL {

inline void rope(const float* in, const float* c, const float* s, int64_t d, float* out) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = in[i], x2 = in[half + i];
    out[i] = x1 * c[i] - x2 * s[i];
    out[half + i] = x2 * c[i] + x1 * s[i];
  }
}

// RoPE on this token's keys, keys and values into the caches at `pos`.
void store_kv(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
              const AttentionShape& sh, void* k_cache, void* v_cache) {
  const int64_t d = sh.head_dim;
  const float* k_in = qkv + sh.heads * d;
  const float* v_in = k_in + sh.kv_heads * d;
  const int64_t row = pos % sh.capacity;  // a ring once the positions pass the capacity
  for (int64_t g = 0; g < sh.kv_heads; ++g) {
    const int64_t at = (g * sh.capacity + row) * d;
    if (sh.kv_half) {
      float k[kMaxHeadDim];
      rope(k_in + g * d, cos_row, sin_row, d, k);
      floats_to_halves(k, d, static_cast<uint16_t*>(k_cache) + at);
      floats_to_halves(v_in + g * d, d, static_cast<uint16_t*>(v_cache) + at);
    } else {
      rope(k_in + g * d, cos_row, sin_row, d, static_cast<float*>(k_cache) + at);
      std::memcpy(static_cast<float*>(v_cache) + at, v_in + g * d, sizeof(float) * d);
    }
  }
}

// Query heads [h0, h1) over positions 0..pos. The heads that share a KV head are taken together
// (up to kAttendBatch at a time): every key and value row is read from memory once for all of
// them, which is what keeps a long context's attention at the cache's streaming speed. Each
// output's arithmetic is that of one head alone (the same dot products, sums and order).
// Half caches are read converted to float as they are loaded. scratch: kAttendBatch * (d +
// attend_scores_stride(pos)) floats.
template <class KV>
void attend_heads_t(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                    const AttentionShape& sh, float scale, const KV* k_cache, const KV* v_cache,
                    int64_t h0, int64_t h1, float* out, float* scratch) {
  const int64_t d = sh.head_dim, group = sh.heads / sh.kv_heads, n = std::min(pos + 1, sh.capacity);
  constexpr int64_t kRows = 64;  // value rows per pass over the heads (16 KiB at d = 64: L1)
  float* q = scratch;                   // [kAttendBatch, d]
  float* p = scratch + kAttendBatch * d;  // [kAttendBatch, ldp]
  const int64_t ldp = attend_scores_stride(n - 1);
  bool bad[kAttendBatch];
  for (int64_t hb = h0; hb < h1;) {
    const int64_t g = hb / group;
    const int64_t he = std::min({h1, (g + 1) * group, hb + kAttendBatch}), nq = he - hb;
    const KV* kc = k_cache + g * sh.capacity * d;
    const KV* vc = v_cache + g * sh.capacity * d;
    for (int64_t j = 0; j < nq; ++j) {
      float* qj = q + j * d;
      rope(qkv + (hb + j) * d, cos_row, sin_row, d, qj);
      for (int64_t i = 0; i < d; ++i) qj[i] *= scale;
    }
    int64_t t = 0;
    if (d % 8 == 0)
      for (; t + 8 <= n; t += 8)  // 8 keys (2 KiB at d = 64) in L1 for all the heads
        for (int64_t j = 0; j < nq; ++j) dot8(q + j * d, kc + t * d, d, p + j * ldp + t);
    for (; t < n; ++t)
      for (int64_t j = 0; j < nq; ++j) p[j * ldp + t] = dot(q + j * d, kc + t * d, d);
    for (int64_t j = 0; j < nq; ++j) {
      float* pj = p + j * ldp;
      if (sh.softcap > 0.f) softcap(pj, n, sh.softcap);
      bool nan = false;
      const float top = max_of(pj, n, &nan);
      float* o = out + (hb + j) * d;
      bad[j] = nan || std::isinf(top);
      if (bad[j]) {  // NaN / Inf in q or k: the result is NaN, as in float math
        std::fill(o, o + d, std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      const float sink = sh.sinks ? sh.sinks[hb + j] : -std::numeric_limits<float>::infinity();
      const float m = std::max(top, sink);  // sinks are finite (checked where they are loaded)
      for (int64_t i = 0; i < n; ++i) pj[i] = exp_poly(pj[i] - m);
      const float total = sh.sinks ? sum_of(pj, n) + exp_poly(sink - m) : sum_of(pj, n);
      for (int64_t i = 0; i < n; ++i) pj[i] = pj[i] / total;
      std::fill(o, o + d, 0.f);
    }
    for (int64_t t0 = 0; t0 < n; t0 += kRows) {  // a block of value rows in L1 for all the heads
      const int64_t t1 = std::min(n, t0 + kRows);
      for (int64_t j = 0; j < nq; ++j)
        if (!bad[j]) add_rows(p + j * ldp + t0, vc + t0 * d, t1 - t0, d, out + (hb + j) * d);
    }
    hb = he;
  }
}

// f(k, v) with the caches as the element type they hold (sh.kv_half: IEEE half, else float).
template <class F>
inline void with_kv_type(const AttentionShape& sh, const void* k_cache, const void* v_cache, F&& f) {
  if (sh.kv_half) f(static_cast<const uint16_t*>(k_cache), static_cast<const uint16_t*>(v_cache));
  else f(static_cast<const float*>(k_cache), static_cast<const float*>(v_cache));
}

void attend_heads(const float* qkv, const float* cos_row, const float* sin_row, int64_t pos,
                  const AttentionShape& sh, float scale, const void* k_cache, const void* v_cache,
                  int64_t h0, int64_t h1, float* out, float* scratch) {
  with_kv_type(sh, k_cache, v_cache, [&](const auto* k, const auto* v) {
    attend_heads_t(qkv, cos_row, sin_row, pos, sh, scale, k, v, h0, h1, out, scratch);
  });
}

// -- prefill: causal attention of many query rows, keys in blocks with an online softmax --------

// s[r][t] = q[r] . k[t] for `rows` query rows and the `nk` <= kKeyBlock keys of a block, through
// the block transposed (kt [d][kKeyBlock]): products accumulated along the keys, the vector
// lanes over keys, no horizontal sums.
template <int64_t D, class KV>
void block_scores(const float* q, int64_t rows, const KV* k, int64_t nk, int64_t d_rt, float* kt, float* s) {
  const int64_t d = D ? D : d_rt;
  for (int64_t t = 0; t < nk; ++t)
    for (int64_t i = 0; i < d; ++i) kt[i * kKeyBlock + t] = kv_float(k[t * d + i]);
  for (int64_t t = nk; t < kKeyBlock; ++t)
    for (int64_t i = 0; i < d; ++i) kt[i * kKeyBlock + t] = 0.f;
  for (int64_t r = 0; r < rows; ++r) {
    const float* qr = q + r * d;
    float* sr = s + r * kKeyBlock;
#if defined(__AVX2__) || defined(__aarch64__)
    constexpr int kNV = kKeyBlock / kVecF;  // the row's scores in registers
    VecF acc[kNV];
    for (int j = 0; j < kNV; ++j) acc[j] = vbroadcast(0.f);
    for (int64_t i = 0; i < d; ++i) {
      const VecF x = vbroadcast(qr[i]);
      const float* kr = kt + i * kKeyBlock;
      for (int j = 0; j < kNV; ++j) acc[j] = vmuladd(acc[j], x, vload(kr + j * kVecF));
    }
    for (int j = 0; j < kNV; ++j) vstore(sr + j * kVecF, acc[j]);
#else
    for (int64_t t = 0; t < kKeyBlock; ++t) sr[t] = 0.f;
    for (int64_t i = 0; i < d; ++i) {
      const float x = qr[i];
      const float* kr = kt + i * kKeyBlock;
      for (int64_t t = 0; t < kKeyBlock; ++t) sr[t] += x * kr[t];
    }
#endif
  }
}

// acc[r] = acc[r] * alpha[r] + sum_t p[r][t] v[t] over the block's first nk[r] keys.
template <int64_t D, class KV>
void block_values(const float* p, const int64_t* nk, const float* alpha, int64_t rows, const KV* v,
                  int64_t d_rt, float* acc) {
  const int64_t d = D ? D : d_rt;
  for (int64_t r = 0; r < rows; ++r) {
    float* ar = acc + r * d;
    for (int64_t i = 0; i < d; ++i) ar[i] = ar[i] * alpha[r];
    add_rows(p + r * kKeyBlock, v, nk[r], d, ar);
  }
}

template <int64_t D, class KV>
void attend_rows_d(const float* q, int64_t ldq, int64_t start, const AttentionShape& sh,
                   const KV* k_cache, const KV* v_cache, int64_t h, int64_t r0, int64_t r1,
                   float* out, int64_t ldo, float* scratch) {
  const int64_t d = sh.head_dim, rows = r1 - r0, g = h / (sh.heads / sh.kv_heads);
  const KV* kc = k_cache + g * sh.capacity * d;
  const KV* vc = v_cache + g * sh.capacity * d;
  float* qs = scratch;                        // [rows, d]
  float* kt = qs + kPrefillRows * d;          // [d, kKeyBlock]
  float* s = kt + d * kKeyBlock;              // [rows, kKeyBlock]
  float* acc = s + kPrefillRows * kKeyBlock;  // [rows, d]
  float m[kPrefillRows], l[kPrefillRows], alpha[kPrefillRows];
  int64_t nk[kPrefillRows];
  bool bad[kPrefillRows];
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(qs + r * d, q + (r0 + r) * ldq + h * d, sizeof(float) * d);
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.f;
    bad[r] = false;
  }
  std::fill(acc, acc + rows * d, 0.f);
  const int64_t last = start + r1;  // keys [0, last) are seen by some row of the block
  // row r (position p = start + r0 + r) sees keys [first(p), p]
  const auto first = [&](int64_t p) { return sh.window > 0 ? std::max<int64_t>(0, p - sh.window + 1) : 0; };
  for (int64_t t0 = first(start + r0) / kKeyBlock * kKeyBlock; t0 < last; t0 += kKeyBlock) {
    const int64_t kb = std::min(kKeyBlock, last - t0);
    block_scores<D>(qs, rows, kc + t0 * d, kb, d, kt, s);
    for (int64_t r = 0; r < rows; ++r) {
      nk[r] = std::max<int64_t>(0, std::min(kb, start + r0 + r + 1 - t0));
      const int64_t lo = std::min(nk[r], std::max<int64_t>(0, first(start + r0 + r) - t0));
      float* sr = s + r * kKeyBlock;
      if (nk[r] > lo && sh.softcap > 0.f) softcap(sr + lo, nk[r] - lo, sh.softcap);
      bool nan = false;
      const float top = nk[r] > lo ? std::max(m[r], max_of(sr + lo, nk[r] - lo, &nan)) : m[r];
      bad[r] = bad[r] || (nk[r] > lo && (nan || std::isinf(top)));
      if (bad[r] || nk[r] == lo) {
        nk[r] = 0;
        alpha[r] = 1.f;
        continue;
      }
      alpha[r] = exp_poly(m[r] - top);  // 0 on the first block (m = -inf, clamped)
      std::fill(sr, sr + lo, 0.f);  // keys before the window weigh nothing
      for (int64_t t = lo; t < nk[r]; ++t) sr[t] = exp_poly(sr[t] - top);
      float sum = 0.f;
      for (int64_t t = lo; t < nk[r]; ++t) sum += sr[t];
      l[r] = l[r] * alpha[r] + sum;
      m[r] = top;
    }
    block_values<D>(s, nk, alpha, rows, vc + t0 * d, d, acc);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + (r0 + r) * ldo + h * d;
    if (bad[r]) {
      std::fill(o, o + d, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    if (sh.sinks) {  // the sink as one more key whose value row is zero
      const float top = std::max(m[r], sh.sinks[h]), a = exp_poly(m[r] - top);
      l[r] = l[r] * a + exp_poly(sh.sinks[h] - top);
      for (int64_t i = 0; i < d; ++i) acc[r * d + i] = acc[r * d + i] * a;
    }
    const float inv = 1.f / l[r];
    for (int64_t i = 0; i < d; ++i) o[i] = acc[r * d + i] * inv;
  }
}

// Query rows [r0, r1) (r1 - r0 <= kPrefillRows) of head h; q: RoPE'd and scaled queries
// [rows, ldq] (head h at column h * d), row r at position start + r; out [rows, ldo].
// scratch: prefill_scratch_floats(d) floats.
void attend_rows(const float* q, int64_t ldq, int64_t start, const AttentionShape& sh,
                 const void* k_cache, const void* v_cache, int64_t h, int64_t r0, int64_t r1,
                 float* out, int64_t ldo, float* scratch) {
  with_kv_type(sh, k_cache, v_cache, [&](const auto* k, const auto* v) {
    if (sh.head_dim == 64)
      attend_rows_d<64>(q, ldq, start, sh, k, v, h, r0, r1, out, ldo, scratch);
    else if (sh.head_dim == 128)
      attend_rows_d<128>(q, ldq, start, sh, k, v, h, r0, r1, out, ldo, scratch);
    else
      attend_rows_d<0>(q, ldq, start, sh, k, v, h, r0, r1, out, ldo, scratch);
  });
}

// RoPE on query row r's heads (position start + r) times `scale`, into q [rows, heads * d].
void rope_queries(const float* qkv, int64_t ldqkv, const float* cos, const float* sin, int64_t start,
                  const AttentionShape& sh, float scale, int64_t r0, int64_t r1, float* q) {
  const int64_t d = sh.head_dim, half = d / 2;
  for (int64_t r = r0; r < r1; ++r) {
    const float* c = cos + (start + r) * half;
    const float* s = sin + (start + r) * half;
    for (int64_t h = 0; h < sh.heads; ++h) {
      float* qh = q + r * sh.heads * d + h * d;
      rope(qkv + r * ldqkv + h * d, c, s, d, qh);
      for (int64_t i = 0; i < d; ++i) qh[i] *= scale;
    }
  }
}

}  // namespace qlinear::decoder::QLINEAR_DECODER_IMPL

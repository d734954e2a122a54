// Few-token kernels for 64-bit Arm with the dot-product extension (Armv8.2 FEAT_DotProd: sdot, four int8
// products summed into each int32 lane), included by matmul-inl.h in its NEON pass only. Highway 1.0.3 has no
// int8 dot product, and its NEON target assumes only Armv8.0, so these kernels run only where the CPU reports
// the extension (HasDotProd); elsewhere the NEON target keeps its int16 kernels.
//
// One row times one token, against the token's int8 activations (QuantizedTokens::q8, one scale per activation
// group: per 32-element block, or per 256-element super-block for the K-quants). Quants are made signed before
// the product (q - 8, q - 16, q - 32), so the legacy types need no offset term; Q4_K/Q5_K subtract
// dmin * sum_j m_j * (sum of x over sub-block j) from QuantizedTokens::scaled_sum32, as the int16 kernels do.
// Integer sums are exact; only the order of the float additions differs from the other targets.

// acc + the lane-wise sums of four products of a and b. Where the compiler does not target the extension, the
// instruction comes as inline assembly: GCC refuses to inline its intrinsic (or any always-inline helper) across
// functions whose target options differ, and these kernels call both. The .arch directive lets the assembler
// accept sdot from there on (GNU as 2.40 ignores .arch_extension dotprod); the compiler's own code is unchanged.
HWY_INLINE int32x4_t Sdot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  asm(".arch armv8.2-a+dotprod\n\tsdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
  return acc;
#endif
}

// Whether this CPU has sdot: fixed at compile time when the compiler targets it, else the kernel's hardware
// capability bits (Linux); other systems keep the int16 kernels.
inline bool HasDotProd() {
#if defined(__ARM_FEATURE_DOTPROD)
  return true;
#elif defined(__linux__)
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
#else
  return false;
#endif
}

constexpr bool HasDotProdKernel(TensorType type) {
  return type == TensorType::Q8_0 || type == TensorType::Q4_0 || type == TensorType::Q5_0 || type == TensorType::Q4_K ||
         type == TensorType::Q5_K || type == TensorType::Q6_K;
}

// 16 bytes of 4-bit quants -> signed quants q - offset, low nibbles and high nibbles.
HWY_INLINE int8x16_t LowNibbles(uint8x16_t q) { return vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F))); }
HWY_INLINE int8x16_t HighNibbles(uint8x16_t q) { return vreinterpretq_s8_u8(vshrq_n_u8(q, 4)); }

// The 32 elements of a legacy block against the token's 32 activations: sum of w[i] * x[i] per lane.
HWY_INLINE int32x4_t DotBlock32(int8x16_t w0, int8x16_t w1, const int8_t* x) {
  return Sdot(Sdot(vdupq_n_s32(0), w0, vld1q_s8(x)), w1, vld1q_s8(x + 16));
}

// Q8_0, Q4_0 and Q5_0 rows: per block the two halves' signed quants, then one float multiply-add by d_w * d_x;
// two float accumulators take alternate blocks so that consecutive blocks do not wait on each other.
template <TensorType kType>
HWY_INLINE void SignedQuants32(const uint8_t* block, int8x16_t* w0, int8x16_t* w1) {
  if constexpr (kType == TensorType::Q8_0) {
    const auto& b = *reinterpret_cast<const fmt::BlockQ8_0*>(block);
    *w0 = vld1q_s8(b.qs);
    *w1 = vld1q_s8(b.qs + 16);
  } else if constexpr (kType == TensorType::Q4_0) {
    const uint8x16_t q = vld1q_u8(reinterpret_cast<const fmt::BlockQ4_0*>(block)->qs);
    *w0 = vsubq_s8(LowNibbles(q), vdupq_n_s8(8));
    *w1 = vsubq_s8(HighNibbles(q), vdupq_n_s8(8));
  } else {
    static_assert(kType == TensorType::Q5_0, "a legacy type with a dot-product kernel");
    const auto& b = *reinterpret_cast<const fmt::BlockQ5_0*>(block);
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    // Bit j of qh is element j's fifth bit: byte j of the vector tests it against its own bit mask.
    const uint8x16_t bit_of = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t h0 = vcombine_u8(vdup_n_u8(uint8_t(qh)), vdup_n_u8(uint8_t(qh >> 8)));
    const uint8x16_t h1 = vcombine_u8(vdup_n_u8(uint8_t(qh >> 16)), vdup_n_u8(uint8_t(qh >> 24)));
    const uint8x16_t sixteen = vdupq_n_u8(16), q = vld1q_u8(b.qs);
    const uint8x16_t lo = vorrq_u8(vandq_u8(q, vdupq_n_u8(0x0F)), vandq_u8(vtstq_u8(h0, bit_of), sixteen));
    const uint8x16_t hi = vorrq_u8(vshrq_n_u8(q, 4), vandq_u8(vtstq_u8(h1, bit_of), sixteen));
    *w0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(16));
    *w1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(16));
  }
}

template <TensorType kType>
HWY_NOINLINE float DotRowLegacyDotProd(const uint8_t* row, int64_t nb, const TokenQ& x) {
  using Block = typename Legacy<kType>::Block;
  float32x4_t acc[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* block = row + b * sizeof(Block);
    int8x16_t w0, w1;
    SignedQuants32<kType>(block, &w0, &w1);
    const float d = ScaleF16(reinterpret_cast<const Block*>(block)->d) * x.scale[b];
    acc[b % 2] = vmlaq_n_f32(acc[b % 2], vcvtq_f32_s32(DotBlock32(w0, w1, x.q8 + 32 * b)), d);
  }
  return vaddvq_f32(vaddq_f32(acc[0], acc[1]));
}

// Q4_K and Q5_K rows: chunk c of a super-block holds sub-blocks 2c (low nibbles, elements 64c..) and 2c + 1
// (high nibbles, 64c + 32..); each sub-block's dot product is weighed by its 6-bit scale in int32, the
// super-block once by d * d_x. Q5_K's fifth bits: bit 2c of qh[l] for element 64c + l, bit 2c + 1 for 64c + 32 + l.
template <TensorType kType>
HWY_NOINLINE float DotRowQ45KDotProd(const uint8_t* row, int64_t nb, const TokenQ& x) {
  constexpr bool kFive = kType == TensorType::Q5_K;
  using Block = std::conditional_t<kFive, fmt::BlockQ5_K, fmt::BlockQ4_K>;
  const Block* blocks = reinterpret_cast<const Block*>(row);
  float32x4_t acc = vdupq_n_f32(0.0f);
  float min_term = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const Block& blk = blocks[b];
    uint8_t sc[8], m[8];
    UnpackScalesMinsK4(blk.scales, sc, m);
    uint8x16_t h[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if constexpr (kFive) h[0] = vld1q_u8(blk.qh), h[1] = vld1q_u8(blk.qh + 16);
    const int8_t* xb = x.q8 + b * fmt::QK_K;
    int32x4_t isum = vdupq_n_s32(0);
    for (int c = 0; c < 4; ++c) {
      int32x4_t lo = vdupq_n_s32(0), hi = vdupq_n_s32(0);
      for (int half = 0; half < 2; ++half) {
        const uint8x16_t q = vld1q_u8(blk.qs + 32 * c + 16 * half);
        uint8x16_t q_lo = vandq_u8(q, vdupq_n_u8(0x0F)), q_hi = vshrq_n_u8(q, 4);
        if constexpr (kFive) {
          q_lo = vorrq_u8(q_lo, vshlq_n_u8(vandq_u8(h[half], vdupq_n_u8(1)), 4));
          q_hi = vorrq_u8(q_hi, vshlq_n_u8(vandq_u8(h[half], vdupq_n_u8(2)), 3));
          h[half] = vshrq_n_u8(h[half], 2);  // the next chunk's two bits
        }
        lo = Sdot(lo, vreinterpretq_s8_u8(q_lo), vld1q_s8(xb + 64 * c + 16 * half));
        hi = Sdot(hi, vreinterpretq_s8_u8(q_hi), vld1q_s8(xb + 64 * c + 32 + 16 * half));
      }
      isum = vmlaq_n_s32(isum, lo, sc[2 * c]);
      isum = vmlaq_n_s32(isum, hi, sc[2 * c + 1]);
    }
    acc = vmlaq_n_f32(acc, vcvtq_f32_s32(isum), ScaleF16(blk.d) * x.scale[b]);
    float mins = 0.0f;
    for (int j = 0; j < 8; ++j) mins += float(m[j]) * x.scaled_sum32[8 * b + j];
    min_term += ScaleF16(blk.dmin) * mins;
  }
  return vaddvq_f32(acc) - min_term;
}

// Q6_K rows: half h of a super-block (elements 128h..) takes ql[64h..], qh[32h..]; for l < 32, element 128h + l
// is ql[64h + l]'s low nibble with bits 0-1 of qh[32h + l] on top, 128h + 32 + l ql[64h + 32 + l]'s low nibble
// with bits 2-3, 128h + 64 + l and 128h + 96 + l the same bytes' high nibbles with bits 4-5 and 6-7. Quants
// minus 32 are signed bytes; each 16-element sub-block's dot product is weighed by its signed scale in int32.
HWY_NOINLINE float DotRowQ6KDotProd(const uint8_t* row, int64_t nb, const TokenQ& x) {
  const auto* blocks = reinterpret_cast<const fmt::BlockQ6_K*>(row);
  const uint8x16_t nibble = vdupq_n_u8(0x0F), two_bits = vdupq_n_u8(0x03);
  const int8x16_t thirty_two = vdupq_n_s8(32);
  float32x4_t acc = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const fmt::BlockQ6_K& blk = blocks[b];
    int32x4_t isum = vdupq_n_s32(0);
    for (int h = 0; h < 2; ++h) {
      const int8_t* xh = x.q8 + b * fmt::QK_K + 128 * h;
      for (int l = 0; l < 32; l += 16) {
        const uint8x16_t a = vld1q_u8(blk.ql + 64 * h + l), c = vld1q_u8(blk.ql + 64 * h + 32 + l);
        const uint8x16_t top = vld1q_u8(blk.qh + 32 * h + l);
        const uint8x16_t quants[4] = {
            vsliq_n_u8(vandq_u8(a, nibble), vandq_u8(top, two_bits), 4),
            vsliq_n_u8(vandq_u8(c, nibble), vandq_u8(vshrq_n_u8(top, 2), two_bits), 4),
            vsliq_n_u8(vshrq_n_u8(a, 4), vandq_u8(vshrq_n_u8(top, 4), two_bits), 4),
            vsliq_n_u8(vshrq_n_u8(c, 4), vshrq_n_u8(top, 6), 4),
        };
        for (int k = 0; k < 4; ++k) {
          const int8x16_t w = vsubq_s8(vreinterpretq_s8_u8(quants[k]), thirty_two);
          const int32x4_t dot = Sdot(vdupq_n_s32(0), w, vld1q_s8(xh + 32 * k + l));
          isum = vmlaq_n_s32(isum, dot, blk.scales[8 * h + 2 * k + l / 16]);
        }
      }
    }
    acc = vmlaq_n_f32(acc, vcvtq_f32_s32(isum), ScaleF16(blk.d) * x.scale[b]);
  }
  return vaddvq_f32(acc);
}

// y[t][r] for rows [row_begin, row_end) and tokens [token_begin, token_end): each row stays in cache while its
// tokens pass over it.
template <TensorType kType>
void DotProdRows(const MatmulJob& job, int64_t row_begin, int64_t row_end, int64_t token_begin, int64_t token_end) {
  const int64_t nb = job.n_in / tensor_type_info(kType)->block_elements;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* row = job.weights + r * job.row_bytes;
    for (int64_t t = token_begin; t < token_end; ++t) {
      const TokenQ x = TokenAt(job, t);
      float y;
      if constexpr (kType == TensorType::Q4_K || kType == TensorType::Q5_K) {
        y = DotRowQ45KDotProd<kType>(row, nb, x);
      } else if constexpr (kType == TensorType::Q6_K) {
        y = DotRowQ6KDotProd(row, nb, x);
      } else {
        y = DotRowLegacyDotProd<kType>(row, nb, x);
      }
      job.y[t * job.n_out + r] = y;
    }
  }
}

// The RoPE rotation on the GPU, one definition for every kernel that applies it (ops/cuda/rope.cu,
// norm.cu's rmsnorm_rope, attention_tc.cu's q prologue and output epilogue): pair j of the rotated
// slice at position pos turns by the angle fp32(inv_freq[j]) · fp32(pos), as the CPU backend
// (ops/rope.h) computes it; the inverse turns by its negative.
#pragma once

namespace cpfill::ops::cuda::rope_device {

// cos and sin of pair j's angle (sin negated for the inverse).
__device__ __forceinline__ void cos_sin(const float* inv_freq, int j, float pos, bool inverse,
                                        float& c, float& s) {
    sincosf(inv_freq[j] * pos, &s, &c);
    if (inverse) s = -s;
}

// (a, b) ← (a·c − b·s, b·c + a·s).
__device__ __forceinline__ void rotate(float& a, float& b, float c, float s) {
    const float x = a, y = b;
    a = x * c - y * s;
    b = y * c + x * s;
}

}  // namespace cpfill::ops::cuda::rope_device

// CUDA's own float32 conversions (cuda_bf16.h, cuda_fp16.h, cuda_fp8.h,
// cuda_fp6.h, cuda_fp4.h), one op per code, for bench/cuda_casts.py to check
// with fpemu.testing. Built there with nvcc into a shared library:
//
//     nvcc -O3 -arch=sm_90 -shared -Xcompiler -fPIC bench/cuda_casts.cu -o cuda_casts.so
//
// fpemu_cast_cuda runs the op on the GPU (device pointers); fpemu_cast_host
// runs the same header function on the CPU (its host code path), so the
// library can be tried on a machine without a GPU.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp4.h>
#include <cuda_fp6.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

// The ops: the result is a 16-bit code (ops 0-7) or an 8-bit one (8 and up).
#define N_OPS 20

__host__ __device__ static inline void one(const float* x, void* y, long long i, int op)
{
    const float v = x[i];
    uint16_t* y16 = (uint16_t*)y;
    uint8_t* y8 = (uint8_t*)y;
    switch (op) {
    case 0: y16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v)); break;
    case 1: y16[i] = __bfloat16_as_ushort(__float2bfloat16_rz(v)); break;
    case 2: y16[i] = __bfloat16_as_ushort(__float2bfloat16_rd(v)); break;
    case 3: y16[i] = __bfloat16_as_ushort(__float2bfloat16_ru(v)); break;
    case 4: y16[i] = __half_as_ushort(__float2half_rn(v)); break;
    case 5: y16[i] = __half_as_ushort(__float2half_rz(v)); break;
    case 6: y16[i] = __half_as_ushort(__float2half_rd(v)); break;
    case 7: y16[i] = __half_as_ushort(__float2half_ru(v)); break;
    case 8: y8[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); break;
    case 9: y8[i] = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E4M3); break;
    case 10: y8[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E5M2); break;
    case 11: y8[i] = __nv_cvt_float_to_fp8(v, __NV_NOSAT, __NV_E5M2); break;
    case 12: y8[i] = __nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundZero); break;
    case 13: y8[i] = __nv_cvt_float_to_e8m0(v, __NV_SATFINITE, cudaRoundPosInf); break;
    case 14: y8[i] = __nv_cvt_float_to_e8m0(v, __NV_NOSAT, cudaRoundPosInf); break;
    case 15: y8[i] = __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest); break;
    case 16: y8[i] = __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundZero); break;
    case 17: y8[i] = __nv_cvt_float_to_fp6(v, __NV_E2M3, cudaRoundNearest); break;
    case 18: y8[i] = __nv_cvt_float_to_fp6(v, __NV_E3M2, cudaRoundNearest); break;
    case 19: y8[i] = __nv_cvt_float_to_fp6(v, __NV_E3M2, cudaRoundZero); break;
    default: break;
    }
}

__global__ void cast_kernel(const float* x, void* y, long long n, int op)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) one(x, y, i, op);
}

extern "C" int fpemu_n_ops(void) { return N_OPS; }

// 0 on success, else the CUDA error code (cudaGetErrorString names it).
extern "C" int fpemu_cast_cuda(const float* x, void* y, long long n, int op)
{
    if (op < 0 || op >= N_OPS) return -1;
    if (n <= 0) return 0;
    const int threads = 256;
    const long long blocks = (n + threads - 1) / threads;
    cast_kernel<<<(unsigned)blocks, threads>>>(x, y, n, op);
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaDeviceSynchronize();
    return (int)err;
}

extern "C" const char* fpemu_cuda_error(int code)
{
    return cudaGetErrorString((cudaError_t)code);
}

extern "C" int fpemu_cast_host(const float* x, void* y, long long n, int op)
{
    if (op < 0 || op >= N_OPS) return -1;
    for (long long i = 0; i < n; ++i) one(x, y, i, op);
    return 0;
}

// The CUDA check run in a container on a real GPU (driver/tests/real_gpu.rs):
// counts the devices, runs a kernel on device 0, checks its result, and prints
//   cuda-check ok: <count> device(s), uuid GPU-<uuid>
// or the failing call and its error, with exit status 1.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void fill(unsigned *out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = i * 3u + 1u;
}

static int fail(const char *what, cudaError_t e) {
    std::printf("cuda-check failed: %s: %s\n", what, cudaGetErrorString(e));
    return 1;
}

int main() {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) return fail("cudaGetDeviceCount", e);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, 0)) != cudaSuccess) return fail("cudaGetDeviceProperties", e);
    const unsigned n = 1u << 20;
    unsigned *dev = nullptr;
    if ((e = cudaMalloc(&dev, n * sizeof(unsigned))) != cudaSuccess) return fail("cudaMalloc", e);
    fill<<<(n + 255) / 256, 256>>>(dev, n);
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return fail("kernel", e);
    static unsigned host[1u << 20];
    if ((e = cudaMemcpy(host, dev, n * sizeof(unsigned), cudaMemcpyDeviceToHost)) != cudaSuccess)
        return fail("cudaMemcpy", e);
    cudaFree(dev);
    for (unsigned i = 0; i < n; i++) {
        if (host[i] != i * 3u + 1u) {
            std::printf("cuda-check failed: element %u is %u\n", i, host[i]);
            return 1;
        }
    }
    const unsigned char *u = reinterpret_cast<const unsigned char *>(prop.uuid.bytes);
    std::printf("cuda-check ok: %d device(s), uuid GPU-"
                "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
                count, u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                u[12], u[13], u[14], u[15]);
    return 0;
}

// CeComm: the flags, the buffer table, the copies and the sum kernel (runtime/cuda/ce_comm.h).
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "runtime/cuda/ce_comm.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/host_wait.h"

namespace cpfill::cuda {

namespace {

constexpr int kMaxRanks = 64;
// What abort() writes into every flag: ahead of any call number a run reaches, so every wait
// (value − flag ≤ 0 as a signed difference) ends.
constexpr uint64_t kAborted = uint64_t{1} << 62;
constexpr int kReady = 0, kDone = 1;
// How long an aborted group's flags are kept past every call number (CeGroup::abort): longer than
// the group's watchdog gives its ranks to stop (30 s).
constexpr std::chrono::seconds kKeepAborted{60};

using WriteValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using WaitValue64 = CUresult (*)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
using DeviceGet = CUresult (*)(CUdevice*, int);
using DeviceGetAttribute = CUresult (*)(int*, CUdevice_attribute, CUdevice);

struct Driver {
    WriteValue64 write = nullptr;
    WaitValue64 wait = nullptr;
    DeviceGet device_get = nullptr;
    DeviceGetAttribute attribute = nullptr;
};

void* entry_point(const char* name) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CPFILL_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q));
    CPFILL_CHECK(q == cudaDriverEntryPointSuccess && p != nullptr,
                 "--collectives ce: the CUDA driver has no {} (a driver for CUDA 12 or later is "
                 "needed)",
                 name);
    return p;
}

const Driver& driver() {
    static Driver d;
    static std::once_flag once;
    std::call_once(once, [] {
        d.write = reinterpret_cast<WriteValue64>(entry_point("cuStreamWriteValue64"));
        d.wait = reinterpret_cast<WaitValue64>(entry_point("cuStreamWaitValue64"));
        d.device_get = reinterpret_cast<DeviceGet>(entry_point("cuDeviceGet"));
        d.attribute = reinterpret_cast<DeviceGetAttribute>(entry_point("cuDeviceGetAttribute"));
    });
    return d;
}

struct Parts {
    const __nv_bfloat16* p[kMaxRanks];
};

// out[i] = Σ_k parts[k][i] in order k = 0 … n − 1, in fp32, rounded once; 8 values a thread.
__global__ void sum_parts8(Parts parts, int n, int64_t count8, __nv_bfloat16* out) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= count8) return;
    float acc[8] = {};
    for (int k = 0; k < n; ++k) {
        const uint4 v = reinterpret_cast<const uint4*>(parts.p[k])[i];
        const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float2 f = __bfloat1622float2(h[j]);
            acc[2 * j] += f.x;
            acc[2 * j + 1] += f.y;
        }
    }
    uint4 o;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) h[j] = __floats2bfloat162_rn(acc[2 * j], acc[2 * j + 1]);
    reinterpret_cast<uint4*>(out)[i] = o;
}

__global__ void sum_parts1(Parts parts, int n, int64_t count, __nv_bfloat16* out) {
    const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
    if (i >= count) return;
    float acc = 0.0f;
    for (int k = 0; k < n; ++k) acc += __bfloat162float(parts.p[k][i]);
    out[i] = __float2bfloat16(acc);
}

void sum_parts(const Parts& parts, int n, int64_t count, void* out, cudaStream_t stream) {
    bool aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0 && count % 8 == 0;
    for (int k = 0; k < n; ++k) aligned &= reinterpret_cast<uintptr_t>(parts.p[k]) % 16 == 0;
    auto* y = static_cast<__nv_bfloat16*>(out);
    const int threads = 256;
    if (aligned) {
        const int64_t c8 = count / 8;
        sum_parts8<<<static_cast<unsigned>((c8 + threads - 1) / threads), threads, 0, stream>>>(
            parts, n, c8, y);
    } else {
        sum_parts1<<<static_cast<unsigned>((count + threads - 1) / threads), threads, 0, stream>>>(
            parts, n, count, y);
    }
    CPFILL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

struct CeGroup : std::enable_shared_from_this<CeGroup> {
    explicit CeGroup(int n) : size(n) {
        for (auto& t : table) t.resize(n);
    }
    ~CeGroup() {
        if (flags) cudaFreeHost(flags);
    }
    CeGroup(const CeGroup&) = delete;
    CeGroup& operator=(const CeGroup&) = delete;

    // Pinned, mapped: flags[kReady · size + r], flags[kDone · size + r]. Allocated by the first
    // communicator made (on a rank's thread, its device current).
    void alloc_flags() {
        std::lock_guard<std::mutex> lock(mu);
        if (flags) return;
        void* p = nullptr;
        CPFILL_CUDA_CHECK(cudaHostAlloc(&p, 2 * size * sizeof(uint64_t),
                                        cudaHostAllocMapped | cudaHostAllocPortable));
        flags = static_cast<uint64_t*>(p);
        for (int i = 0; i < 2 * size; ++i)
            __atomic_store_n(&flags[i], uint64_t{0}, __ATOMIC_SEQ_CST);
    }
    uint64_t* flag(int which, int rank) const { return flags + which * size + rank; }

    void write_aborted() {
        for (int i = 0; i < 2 * size; ++i) __atomic_store_n(&flags[i], kAborted, __ATOMIC_SEQ_CST);
    }

    // Every flag past any call number, so that every stream wait ends. A write a stream had
    // queued before (a ready or done flag of its current call) may still land after and move a
    // flag back below what a peer waits for, so a keeper thread writes them again every
    // millisecond for kKeepAborted while the group lives.
    void abort() noexcept {
        aborted.store(true);
        std::lock_guard<std::mutex> lock(mu);
        if (flags) {
            write_aborted();
            if (!keeper) {
                keeper = true;
                try {
                    std::thread([weak = std::weak_ptr<CeGroup>(shared_from_this())] {
                        const auto t0 = std::chrono::steady_clock::now();
                        while (std::chrono::steady_clock::now() - t0 < kKeepAborted) {
                            if (auto g = weak.lock()) {
                                std::lock_guard<std::mutex> lock(g->mu);
                                g->write_aborted();
                            } else {
                                return;
                            }
                            std::this_thread::sleep_for(std::chrono::milliseconds(1));
                        }
                    }).detach();
                } catch (...) {  // no thread: the first writes stand alone
                }
            }
        }
        cv.notify_all();
        for (auto& d : dups) d->abort();
    }

    const int size;
    uint64_t* flags = nullptr;
    std::mutex mu;
    std::condition_variable cv;
    std::atomic<bool> aborted{false};
    // use_buffers: a barrier by generation; the table of generation g is table[g % 2], so that a
    // rank entering generation g + 1 never overwrites what a slower one still reads of g.
    struct Entry {
        char* base = nullptr;
        size_t bytes = 0;
        int device = 0;
    };
    std::vector<Entry> table[2];
    int arrived = 0;
    uint64_t generation = 0;
    std::vector<std::shared_ptr<CeGroup>> dups;  // the k-th dup() of every rank shares dups[k]
    bool keeper = false;                         // abort()'s keeper thread started
};

std::shared_ptr<CeGroup> make_ce_group(int size) {
    CPFILL_CHECK(size >= 1 && size <= kMaxRanks, "--collectives ce: {} ranks (1 to {})", size,
                 kMaxRanks);
    return std::make_shared<CeGroup>(size);
}

size_t comm_staging_bytes(bool copy_engines, int size, int64_t max_count, CommData type) {
    if (!copy_engines || size <= 1) return 0;
    return static_cast<size_t>(size - 1) * static_cast<size_t>(max_count) * comm_data_bytes(type);
}

CeComm::CeComm(std::shared_ptr<CeGroup> group, int rank)
    : group_(std::move(group)), rank_(rank), size_(group_->size) {
    CPFILL_CHECK(rank >= 0 && rank < size_, "--collectives ce: rank {} outside a group of {}", rank,
                 size_);
    CPFILL_CUDA_CHECK(cudaGetDevice(&device_));
    const Driver& d = driver();
    CUdevice dev = 0;
    int ok = 0;
    CPFILL_CHECK(d.device_get(&dev, device_) == CUDA_SUCCESS &&
                     d.attribute(&ok, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev) ==
                         CUDA_SUCCESS,
                 "--collectives ce: could not query GPU {}", device_);
    CPFILL_CHECK(ok != 0,
                 "--collectives ce: GPU {} (or its driver) cannot wait on 64-bit stream values "
                 "(CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS is 0); use --collectives nccl",
                 device_);
    group_->alloc_flags();
    // The sum kernels loaded now, not at their first launch: with lazy module loading (CUDA's
    // default) a first launch waits for the device, where this rank's stream may wait for a flag
    // that a peer, blocked behind that launch, never queues (docs/parallel.md).
    cudaFuncAttributes attr{};
    CPFILL_CUDA_CHECK(cudaFuncGetAttributes(&attr, sum_parts8));
    CPFILL_CUDA_CHECK(cudaFuncGetAttributes(&attr, sum_parts1));
}

CeComm::~CeComm() = default;

std::unique_ptr<DeviceComm> CeComm::dup() {
    CPFILL_CHECK(!group_->aborted.load(), "copy-engine collectives were aborted");
    std::shared_ptr<CeGroup> g;
    {
        std::lock_guard<std::mutex> lock(group_->mu);
        const size_t k = static_cast<size_t>(dups_++);
        if (group_->dups.size() <= k) group_->dups.push_back(std::make_shared<CeGroup>(size_));
        g = group_->dups[k];
    }
    return std::make_unique<CeComm>(std::move(g), rank_);
}

void CeComm::use_buffers(void* base, size_t bytes, void* staging, size_t staging_bytes,
                         const AbortFlag& flag, std::chrono::milliseconds deadline) {
    CeGroup& g = *group_;
    std::vector<CeGroup::Entry> entries;
    {
        std::unique_lock<std::mutex> lock(g.mu);
        const uint64_t gen = g.generation;
        g.table[gen % 2][rank_] = {static_cast<char*>(base), bytes, device_};
        if (++g.arrived == size_) {
            g.arrived = 0;
            ++g.generation;
            g.cv.notify_all();
        } else {
            const auto t0 = std::chrono::steady_clock::now();
            while (g.generation == gen) {
                CPFILL_CHECK(!g.aborted.load(), "copy-engine collectives were aborted");
                if (flag.raised())
                    CPFILL_FAIL("registering buffers: stopped because {}", flag.why());
                if (std::chrono::steady_clock::now() - t0 > deadline)
                    CPFILL_FAIL(
                        "registering buffers: the other ranks did not arrive within {} ms (a peer "
                        "rank stalled or died?)",
                        deadline.count());
                g.cv.wait_for(lock, std::chrono::milliseconds(10));
            }
        }
        entries = g.table[gen % 2];
    }
    bases_.assign(size_, nullptr);
    devices_.assign(size_, 0);
    for (int p = 0; p < size_; ++p) {
        CPFILL_CHECK(entries[p].bytes == bytes,
                     "--collectives ce: rank {} planned a workspace of {} bytes, rank {} one of {} "
                     "(every rank must plan alike)",
                     rank_, bytes, p, entries[p].bytes);
        bases_[p] = entries[p].base;
        devices_[p] = entries[p].device;
    }
    bytes_ = bytes;
    staging_ = static_cast<char*>(staging);
    staging_bytes_ = staging_bytes;
    // Peer access, once per pair of GPUs (enabling it twice is an error CUDA reports and we
    // clear). Without it CUDA would copy through the host, far slower than NCCL: refused.
    for (int p = 0; p < size_; ++p) {
        const int dev = devices_[p];
        if (dev == device_) continue;
        int can = 0;
        CPFILL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, dev));
        CPFILL_CHECK(can != 0,
                     "--collectives ce: GPU {} cannot reach GPU {}'s memory (no peer access), so "
                     "its copies would go through the host; use --collectives nccl",
                     device_, dev);
        const cudaError_t e = cudaDeviceEnablePeerAccess(dev, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
        else
            CPFILL_CUDA_CHECK(e);
    }
}

const char* CeComm::peer_address(int peer, const void* mine, size_t bytes) const {
    const char* p = static_cast<const char*>(mine);
    const char* base = bases_[rank_];
    CPFILL_CHECK(p >= base && p + bytes <= base + bytes_,
                 "--collectives ce: a send buffer outside the registered workspace ({} bytes at "
                 "offset {} of {})",
                 bytes, static_cast<int64_t>(p - base), bytes_);
    return bases_[peer] + (p - base);
}

void CeComm::signal(int which, int rank, uint64_t value, cudaStream_t stream) {
    // Default flags: the write waits for the stream's earlier work and its memory writes.
    const CUresult r =
        driver().write(stream, reinterpret_cast<CUdeviceptr>(group_->flag(which, rank)), value, 0);
    CPFILL_CHECK(r == CUDA_SUCCESS, "--collectives ce: cuStreamWriteValue64 failed (error {})",
                 static_cast<int>(r));
}

void CeComm::await(int which, int rank, uint64_t value, cudaStream_t stream) {
    const CUresult r =
        driver().wait(stream, reinterpret_cast<CUdeviceptr>(group_->flag(which, rank)), value,
                      CU_STREAM_WAIT_VALUE_GEQ);
    CPFILL_CHECK(r == CUDA_SUCCESS, "--collectives ce: cuStreamWaitValue64 failed (error {})",
                 static_cast<int>(r));
}

void CeComm::collective(Kind kind, const void* send, void* recv, int64_t count, CommData type,
                        cudaStream_t stream) {
    CPFILL_CHECK(!group_->aborted.load(), "copy-engine collectives were aborted");
    CPFILL_CHECK(count >= 0, "--collectives ce: {} values", count);
    CPFILL_CHECK(kind == Kind::Gather || type == CommData::Bf16,
                 "--collectives ce: only bf16 values are summed");
    CPFILL_CHECK(!bases_.empty(), "--collectives ce: a collective before use_buffers");
    const size_t B = static_cast<size_t>(count) * comm_data_bytes(type);
    const int C = size_, r = rank_;
    char* out = static_cast<char*>(recv);
    const char* in = static_cast<const char*>(send);
    if (kind != Kind::Gather)
        CPFILL_CHECK(static_cast<size_t>(C - 1) * B <= staging_bytes_,
                     "--collectives ce: a reduction of {} bytes over {} ranks needs {} bytes of "
                     "staging, {} planned (a planning bug)",
                     B, C, static_cast<size_t>(C - 1) * B, staging_bytes_);
    // Every check before anything is queued: a refused call leaves the streams and the call
    // count as they were.
    const size_t send_bytes = kind == Kind::ReduceScatter ? B * C : B;
    std::vector<const char*> src(C, nullptr);
    for (int p = 0; p < C; ++p)
        if (p != r)
            src[p] = peer_address(p, in, send_bytes) + (kind == Kind::ReduceScatter ? r * B : 0);
    const uint64_t n = ++calls_;
    signal(kReady, r, n, stream);
    for (int k = 1; k < C; ++k) {
        const int p = (r + k) % C;
        await(kReady, p, n, stream);
        char* dst = kind == Kind::Gather ? out + p * B : staging_ + (k - 1) * B;
        if (B) CPFILL_CUDA_CHECK(cudaMemcpyPeerAsync(dst, device_, src[p], devices_[p], B, stream));
    }
    if (kind == Kind::Gather && out + r * B != in && B)
        CPFILL_CUDA_CHECK(cudaMemcpyAsync(out + r * B, in, B, cudaMemcpyDeviceToDevice, stream));
    signal(kDone, r, n, stream);
    const auto await_peers = [&] {
        for (int k = 1; k < C; ++k) await(kDone, (r + k) % C, n, stream);
    };
    if (kind == Kind::Gather) {
        await_peers();
        return;
    }
    Parts parts{};
    for (int p = 0; p < C; ++p) {
        const int k = (p - r + C) % C;  // the ring step that pulled p's part (0: r's own)
        const char* part =
            k == 0 ? in + (kind == Kind::ReduceScatter ? r * B : 0) : staging_ + (k - 1) * B;
        parts.p[p] = reinterpret_cast<const __nv_bfloat16*>(part);
    }
    // An all-reduce may write its sum over send, which the peers read until their done flags.
    if (kind == Kind::AllReduce) await_peers();
    if (count) sum_parts(parts, C, count, out, stream);
    if (kind == Kind::ReduceScatter) await_peers();
}

void CeComm::all_gather(const void* send, void* recv, int64_t count, CommData type,
                        cudaStream_t stream) {
    collective(Kind::Gather, send, recv, count, type, stream);
}

void CeComm::reduce_scatter(const void* send, void* recv, int64_t count, CommData type,
                            cudaStream_t stream) {
    collective(Kind::ReduceScatter, send, recv, count, type, stream);
}

void CeComm::all_reduce(const void* send, void* recv, int64_t count, CommData type,
                        cudaStream_t stream) {
    collective(Kind::AllReduce, send, recv, count, type, stream);
}

void CeComm::abort() noexcept { group_->abort(); }

}  // namespace cpfill::cuda

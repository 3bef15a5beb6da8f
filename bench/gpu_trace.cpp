// libcpfill_gpu_trace.so: a CUDA injection library (CUDA_INJECTION64_PATH) that records, through
// CUPTI's activity API, every kernel, memory copy and memset the process runs on a GPU and every
// CUDA runtime call its threads make, with their start and end in nanoseconds on one clock, and
// writes them as tab-separated lines to $CPFILL_TRACE_OUT (default gpu-trace.tsv):
//   kind  start  end  stream  correlation  thread  name
// kind: K (kernel), C (copy), S (memset), R / D (a runtime / driver call; stream 0, the call's
// name). A GPU record and the call that queued it share the correlation id. scripts/gpu-timeline.sh
// runs a command with it and reads where the GPU sat idle and why (docs/performance-notes.md,
// session 47: the GPU machines have Nsight Compute but no Nsight Systems). Measurement only: not
// linked into cpfill.
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;

// File-scope state, against the rule of no globals: CUPTI calls back plain functions with no user
// pointer, and an injection library lives as long as the process.
std::FILE* g_out = nullptr;  // the trace; closed by finish()
std::mutex g_mu;             // CUPTI may complete buffers on its own threads

void check(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "gpu_trace: %s failed: %s\n", what, msg ? msg : "?");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = *buffer ? kBufferBytes : 0;
    *max_records = 0;
}

// A kernel's name without its namespaces, template arguments, parameters and return type:
// "void cpfill::ops::(anonymous namespace)::gather_kernel<4>(…)" → "gather_kernel".
std::string short_name(const char* mangled) {
    int status = 0;
    char* full = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    std::string s = status == 0 && full ? full : mangled;
    std::free(full);
    std::string out;
    int depth = 0;  // inside <…> or (…)
    for (char c : s) {
        if (c == '<' || c == '(') {
            ++depth;
        } else if (c == '>' || c == ')') {
            --depth;
        } else if (depth == 0) {
            out += c;
            if (c == ' ' || c == ':') out.clear();  // a return type or a namespace before it
        }
    }
    return out.empty() ? s : out;
}

void write(char kind, uint64_t start, uint64_t end, uint32_t stream, uint32_t corr, uint32_t thread,
           const char* name) {
    std::fprintf(g_out, "%c\t%llu\t%llu\t%u\t%u\t%u\t%s\n", kind,
                 static_cast<unsigned long long>(start), static_cast<unsigned long long>(end),
                 stream, corr, thread, name ? name : "?");
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(g_mu);
    CUpti_Activity* rec = nullptr;
    while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
                write('K', k->start, k->end, k->streamId, k->correlationId, 0,
                      short_name(k->name ? k->name : "?").c_str());
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
                write('C', m->start, m->end, m->streamId, m->correlationId, 0, "memcpy");
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
                write('S', m->start, m->end, m->streamId, m->correlationId, 0, "memset");
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME:
            case CUPTI_ACTIVITY_KIND_DRIVER: {
                const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
                const bool rt = rec->kind == CUPTI_ACTIVITY_KIND_RUNTIME;
                const char* name = nullptr;
                cuptiGetCallbackName(rt ? CUPTI_CB_DOMAIN_RUNTIME_API : CUPTI_CB_DOMAIN_DRIVER_API,
                                     a->cbid, &name);
                write(rt ? 'R' : 'D', a->start, a->end, 0, a->correlationId, a->threadId, name);
                break;
            }
            default:
                break;
        }
    }
    std::free(buffer);
}

void finish() {
    check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_out) std::fclose(g_out);
    g_out = nullptr;
}

}  // namespace

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
extern "C" int InitializeInjection() {
    const char* path = std::getenv("CPFILL_TRACE_OUT");
    g_out = std::fopen(path && *path ? path : "gpu-trace.tsv", "w");
    if (!g_out) {
        std::perror("gpu_trace: cannot open the output");
        return 0;
    }
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
          "cuptiActivityRegisterCallbacks");
    for (CUpti_ActivityKind k :
         {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
          CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME, CUPTI_ACTIVITY_KIND_DRIVER})
        check(cuptiActivityEnable(k), "cuptiActivityEnable");
    std::atexit(finish);
    return 1;
}

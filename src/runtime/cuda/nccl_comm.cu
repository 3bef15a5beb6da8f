// NcclComm: init by unique id, ncclCommSplit for dup, collectives, abort.
#include "runtime/cuda/nccl_comm.h"

namespace cpfill::cuda {

namespace {

ncclDataType_t nccl_type(CommData t) { return t == CommData::Bf16 ? ncclBfloat16 : ncclInt8; }

}  // namespace

NcclComm::NcclComm(int rank, int size, const ncclUniqueId& id) : rank_(rank), size_(size) {
    CPFILL_CHECK(rank >= 0 && rank < size, "NCCL rank {} outside a group of {}", rank, size);
    CPFILL_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
}

NcclComm::~NcclComm() {
    if (!comm_) return;
    if (aborted_) return;  // ncclCommAbort already freed it
    ncclCommDestroy(comm_);
}

std::unique_ptr<DeviceComm> NcclComm::dup() {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    ncclComm_t c = nullptr;
    CPFILL_NCCL_CHECK(ncclCommSplit(comm_, 0, rank_, &c, nullptr));
    return std::unique_ptr<DeviceComm>(new NcclComm(c, rank_, size_));
}

void NcclComm::all_gather(const void* send, void* recv, int64_t count, CommData type,
                          cudaStream_t stream) {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    CPFILL_NCCL_CHECK(
        ncclAllGather(send, recv, static_cast<size_t>(count), nccl_type(type), comm_, stream));
}

void NcclComm::reduce_scatter(const void* send, void* recv, int64_t count, CommData type,
                              cudaStream_t stream) {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    CPFILL_CHECK(type == CommData::Bf16, "NCCL reduce-scatter: only bf16 values are summed");
    CPFILL_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(count), nccl_type(type),
                                        ncclSum, comm_, stream));
}

void NcclComm::all_reduce(const void* send, void* recv, int64_t count, CommData type,
                          cudaStream_t stream) {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    CPFILL_CHECK(type == CommData::Bf16, "NCCL all-reduce: only bf16 values are summed");
    CPFILL_NCCL_CHECK(ncclAllReduce(send, recv, static_cast<size_t>(count), nccl_type(type),
                                    ncclSum, comm_, stream));
}

void NcclComm::abort() noexcept {
    if (!comm_ || aborted_.exchange(true)) return;
    ncclCommAbort(comm_);
}

}  // namespace cpfill::cuda

// NcclComm: init by unique id, ncclCommSplit for dup, collectives, abort.
#include "runtime/cuda/nccl_comm.h"

namespace cpfill::cuda {

NcclComm::NcclComm(int rank, int size, const ncclUniqueId& id) : rank_(rank), size_(size) {
    CPFILL_CHECK(rank >= 0 && rank < size, "NCCL rank {} outside a group of {}", rank, size);
    CPFILL_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
}

NcclComm::~NcclComm() {
    if (!comm_) return;
    if (aborted_) return;  // ncclCommAbort already freed it
    ncclCommDestroy(comm_);
}

std::unique_ptr<NcclComm> NcclComm::dup() {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    ncclComm_t c = nullptr;
    CPFILL_NCCL_CHECK(ncclCommSplit(comm_, 0, rank_, &c, nullptr));
    return std::unique_ptr<NcclComm>(new NcclComm(c, rank_, size_));
}

void NcclComm::all_gather(const void* send, void* recv, int64_t count, ncclDataType_t type,
                          cudaStream_t stream) {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    CPFILL_NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(count), type, comm_, stream));
}

void NcclComm::reduce_scatter(const void* send, void* recv, int64_t count, ncclDataType_t type,
                              cudaStream_t stream) {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    CPFILL_NCCL_CHECK(
        ncclReduceScatter(send, recv, static_cast<size_t>(count), type, ncclSum, comm_, stream));
}

void NcclComm::all_reduce(const void* send, void* recv, int64_t count, ncclDataType_t type,
                          cudaStream_t stream) {
    CPFILL_CHECK(!aborted_, "NCCL communicator was aborted");
    CPFILL_NCCL_CHECK(
        ncclAllReduce(send, recv, static_cast<size_t>(count), type, ncclSum, comm_, stream));
}

void NcclComm::abort() noexcept {
    if (!comm_ || aborted_.exchange(true)) return;
    ncclCommAbort(comm_);
}

}  // namespace cpfill::cuda

// MpiSession: the multi-process mode of the CUDA backend (docs/design.md §4: one process per GPU or
// machine under mpirun; NCCL bootstrapped with a unique id broadcast over MPI). Active when this
// process was started by mpirun with more than one process (OpenMPI's or PMI's environment);
// tools/ is the only place that reads the environment.
#pragma once

#include "parallel/gpu_prefill.h"

namespace cpfill::tools {

// Processes mpirun (or a PMI launcher) started, from their environment; 1 when none.
int mpirun_processes();

class MpiSession {
  public:
    // MPI_Init when launched by mpirun with ≥ 2 processes; inactive otherwise. Throws when the
    // environment says mpirun but this cpfill was built without MPI.
    MpiSession();
    ~MpiSession();  // MPI_Finalize
    MpiSession(const MpiSession&) = delete;
    MpiSession& operator=(const MpiSession&) = delete;

    bool active() const { return active_; }
    int rank() const { return rank_; }
    int size() const { return size_; }
    int local_rank() const { return local_rank_; }  // GPU index of this process on its machine
    // Rank 0's id, on every process.
    NcclId broadcast(const NcclId& id) const;
    // Stops every process of the job (a failed rank must not leave its peers waiting in NCCL).
    [[noreturn]] void abort(int code) const;

  private:
    bool active_ = false;
    int rank_ = 0, size_ = 1, local_rank_ = 0;
};

}  // namespace cpfill::tools

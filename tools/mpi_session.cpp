// MpiSession through OpenMPI (when CMake found MPI), or a clear error when mpirun started a build
// without it.
#include "tools/mpi_session.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

#ifdef CPFILL_HAVE_MPI
#include <mpi.h>
#endif

namespace cpfill::tools {

namespace {

int env_int(const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

int mpirun_processes() {
    return std::max(env_int("OMPI_COMM_WORLD_SIZE", 1), env_int("PMI_SIZE", 1));
}

MpiSession::MpiSession() {
    if (mpirun_processes() < 2) return;
#ifdef CPFILL_HAVE_MPI
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) MPI_Init(nullptr, nullptr);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    local_rank_ = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", 0));
    active_ = true;
#else
    CPFILL_FAIL(
        "started by mpirun with {} processes, but this cpfill was built without MPI (install "
        "libopenmpi-dev and rebuild)",
        mpirun_processes());
#endif
}

MpiSession::~MpiSession() {
#ifdef CPFILL_HAVE_MPI
    if (active_) MPI_Finalize();
#endif
}

NcclId MpiSession::broadcast(const NcclId& id) const {
    NcclId out = id;
#ifdef CPFILL_HAVE_MPI
    if (active_) MPI_Bcast(out.data(), static_cast<int>(out.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
    return out;
}

void MpiSession::abort(int code) const {
#ifdef CPFILL_HAVE_MPI
    if (active_) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    std::exit(code);
}

}  // namespace cpfill::tools

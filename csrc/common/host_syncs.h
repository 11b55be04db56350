// A count of the library's host synchronisations: every time an op of this library makes
// the host wait for its GPU stream (to read a size or a check's result back). Read by the
// HostSyncCount op (host_syncs_op.cc); benchmarks report it per training step. Beside it,
// the deferred read-backs: an asynchronous op that reads a size back without waiting
// (its outputs are allocated in a callback once the stream has passed the copy, and no
// thread blocks meanwhile).
#ifndef TF_SPARSECONV_COMMON_HOST_SYNCS_H_
#define TF_SPARSECONV_COMMON_HOST_SYNCS_H_

#include <cstdint>

namespace tf_sparseconv {

// Called right before each wait (thread-safe).
void CountHostSync();

// The waits counted since the library was loaded.
int64_t HostSyncCount();

// Called when an op queues a read-back that it does not wait for (thread-safe).
void CountDeferredReadBack();

// The deferred read-backs counted since the library was loaded.
int64_t DeferredReadBackCount();

}  // namespace tf_sparseconv

#endif  // TF_SPARSECONV_COMMON_HOST_SYNCS_H_

// Package dist holds what data-parallel training needs besides the collectives
// themselves: who this process is (rank, world size, rendezvous address, from
// flags or the torchrun-style environment), a TCP rendezvous through which the
// ranks exchange small opaque blobs such as the NCCL unique id, a watch on the
// other ranks so that one that dies makes the rest stop with an error instead
// of hanging, and the split of a global batch into one slice per rank.
//
// It knows nothing about GPUs: the rendezvous and the sharding are plain Go and
// are tested on the CPU with goroutines and with real processes on loopback,
// which is exactly what two hosts do over a network.
package dist

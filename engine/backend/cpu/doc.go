// Package cpu is the pure-Go reference backend: every op of engine/backend.Backend computed on
// the host with fp32 (or wider) arithmetic, parallelised over a pool of GOMAXPROCS worker
// goroutines. It is the numerical oracle other backends are tested against, and a usable
// training device for small models.
//
// It is not tuned for speed beyond blocked, multithreaded loops, and it does not emulate a
// GPU's memory hierarchy or streams: every op completes before it returns, so Sync is a no-op.
//
// Storage: F32 everywhere; BF16 and F16 are accepted for every float input and output (converted
// to fp32 on load, rounded to nearest even on store). Work is split into fixed-size chunks whose
// partial results are combined in chunk order, so results are bit-for-bit identical for any
// number of cores.
//
// Importing the package registers the "cpu" kind with engine/backend.
package cpu

// Package tensor defines the engine's value types for data that lives on a device: DType, Shape
// and Tensor (shape + dtype + a Buffer owned by a backend), plus host-side number conversions
// (bf16 and f16 to and from f32 with round-to-nearest-even, stochastic rounding to bf16).
//
// It is not a tensor library: it performs no arithmetic on device data and allocates no device
// memory. Allocation, copies and every op live behind engine/backend.Backend; a Tensor here is a
// typed, shaped window into a Buffer that one backend created and only that backend may use.
//
// Tensors are small values (copy them freely). Views (Rows, View, Reshape) share the buffer and
// never copy; only the backend that allocated a buffer frees it.
package tensor

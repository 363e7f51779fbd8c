package backend

import (
	"fmt"

	"github.com/halo-shell/halo-shell/engine/tensor"
)

// FromFloat32 allocates a tensor of dtype dt (F32, BF16 or F16) and shape on b and uploads data
// (rounded to nearest even). len(data) must equal the shape's element count.
func FromFloat32(b Backend, data []float32, dt tensor.DType, shape ...int) (T, error) {
	if n := tensor.Shape(shape).Numel(); n != len(data) {
		return T{}, fmt.Errorf("backend: FromFloat32: %d values for shape %v (%d elements)", len(data), shape, n)
	}
	raw, err := tensor.EncodeFloat32(dt, data)
	if err != nil {
		return T{}, err
	}
	t, err := b.Alloc(dt, shape...)
	if err != nil {
		return T{}, err
	}
	if err := b.Upload(t, raw); err != nil {
		_ = b.Free(t)
		return T{}, err
	}
	return t, nil
}

// FromInt32 allocates an I32 tensor on b holding data.
func FromInt32(b Backend, data []int32, shape ...int) (T, error) {
	if n := tensor.Shape(shape).Numel(); n != len(data) {
		return T{}, fmt.Errorf("backend: FromInt32: %d values for shape %v (%d elements)", len(data), shape, n)
	}
	t, err := b.Alloc(tensor.I32, shape...)
	if err != nil {
		return T{}, err
	}
	if err := b.Upload(t, tensor.EncodeInt32(data)); err != nil {
		_ = b.Free(t)
		return T{}, err
	}
	return t, nil
}

// ToFloat32 downloads t (any float or integer dtype) and converts it to float32 on the host.
func ToFloat32(b Backend, t T) ([]float32, error) {
	raw := make([]byte, t.Bytes())
	if err := b.Download(raw, t); err != nil {
		return nil, err
	}
	return tensor.DecodeFloat32(t.DType(), raw)
}

// ToInt32 downloads an I32 tensor.
func ToInt32(b Backend, t T) ([]int32, error) {
	if t.DType() != tensor.I32 {
		return nil, fmt.Errorf("backend: ToInt32: tensor %v is not i32", t)
	}
	raw := make([]byte, t.Bytes())
	if err := b.Download(raw, t); err != nil {
		return nil, err
	}
	return tensor.DecodeInt32(raw)
}

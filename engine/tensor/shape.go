package tensor

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Shape is a tensor's dimensions, outermost first; rows are contiguous (C order). A scalar has
// an empty shape and one element.
type Shape []int

// MaxElements bounds the element count of any shape this package accepts (2^48), so that sizes
// computed from outside input can never overflow int64 byte counts.
const MaxElements = int64(1) << 48

// Numel returns the number of elements (1 for a scalar). It assumes a valid shape; see Check.
func (s Shape) Numel() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// Check returns an error if a dimension is negative or the element count exceeds MaxElements.
func (s Shape) Check() error {
	n := int64(1)
	for i, d := range s {
		if d < 0 {
			return fmt.Errorf("tensor: shape %v: dimension %d is negative", []int(s), i)
		}
		if d != 0 && n > MaxElements/int64(d) {
			return fmt.Errorf("tensor: shape %v: more than %d elements", []int(s), MaxElements)
		}
		n *= int64(d)
	}
	return nil
}

// Equal reports whether two shapes have the same dimensions.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Clone returns a copy that does not alias s.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

// Last returns the innermost dimension (1 for a scalar).
func (s Shape) Last() int {
	if len(s) == 0 {
		return 1
	}
	return s[len(s)-1]
}

// Rows returns the product of all dimensions but the last: the number of rows of the tensor seen
// as a matrix [Rows, Last].
func (s Shape) Rows() int {
	if len(s) == 0 {
		return 1
	}
	return Shape(s[:len(s)-1]).Numel()
}

// String formats the shape as [2 3 4].
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.Itoa(d)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// Infer resolves a single -1 dimension of s so that the result has n elements.
func (s Shape) Infer(n int) (Shape, error) {
	out := s.Clone()
	free := -1
	known := 1
	for i, d := range out {
		switch {
		case d == -1 && free >= 0:
			return nil, fmt.Errorf("tensor: shape %v: more than one -1 dimension", []int(s))
		case d == -1:
			free = i
		case d < 0:
			return nil, fmt.Errorf("tensor: shape %v: dimension %d is negative", []int(s), i)
		default:
			if d != 0 && known > math.MaxInt/d {
				return nil, fmt.Errorf("tensor: shape %v: too many elements", []int(s))
			}
			known *= d
		}
	}
	if free >= 0 {
		if known == 0 || n%known != 0 {
			return nil, fmt.Errorf("tensor: cannot infer -1 in shape %v for %d elements", []int(s), n)
		}
		out[free] = n / known
	}
	if out.Numel() != n {
		return nil, fmt.Errorf("tensor: shape %v has %d elements, want %d", []int(out), out.Numel(), n)
	}
	return out, nil
}

package safetensors

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error that reports malformed input: a file whose header or
// layout breaks the format, an index that names missing files, or tensors that cannot be
// written. Test for it with errors.Is.
var ErrInvalid = errors.New("invalid safetensors data")

// FormatError reports malformed input. It names the file, the tensor when the problem is about
// one, and the problem.
type FormatError struct {
	File    string // the file's path, or the name given to Read
	Tensor  string // the tensor's name; empty when the problem is not about one tensor
	Problem string // what is wrong, and what to do where there is something to do
}

func (e *FormatError) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("safetensors: %s: tensor %q: %s", e.File, e.Tensor, e.Problem)
	}
	return fmt.Sprintf("safetensors: %s: %s", e.File, e.Problem)
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *FormatError) Unwrap() error { return ErrInvalid }

func formatErr(file, tensor, format string, args ...any) error {
	return &FormatError{File: file, Tensor: tensor, Problem: fmt.Sprintf(format, args...)}
}

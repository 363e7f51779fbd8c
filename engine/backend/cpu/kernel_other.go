//go:build !amd64

package cpu

var useAVX2 = false

func kernel6x16(k int, a, b, acc []float32) { kernel6x16Go(k, a, b, acc) }

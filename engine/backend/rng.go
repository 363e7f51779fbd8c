package backend

// mix64 is the splitmix64 finaliser (Steele, Lea, Flood 2014).
func mix64(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// SRBits is the counter-based random stream for stochastic rounding: 32 bits that depend only on
// (seed, step, param, role, elem). Every backend must compute exactly
//
//	h = mix64(seed); h = mix64(h ^ step); h = mix64(h ^ (param<<8 | role)); h = mix64(h ^ elem)
//	return uint32(h >> 32)
//
// where mix64 is the splitmix64 finaliser (add 0x9e3779b97f4a7c15, then xor-shift-multiply by
// 0xbf58476d1ce4e5b9 (>>30) and 0x94d049bb133111eb (>>27), then xor >>31), so that bf16 training
// is bit-for-bit reproducible across backends and runs.
func SRBits(seed, step uint64, param uint32, role uint8, elem uint64) uint32 {
	h := mix64(seed)
	h = mix64(h ^ step)
	h = mix64(h ^ (uint64(param)<<8 | uint64(role)))
	h = mix64(h ^ elem)
	return uint32(h >> 32)
}

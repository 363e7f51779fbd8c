package cpu

import "github.com/halo-shell/halo-shell/engine/backend"

// dsv4Fills set the members of backend.DSV4Ops that one file implements (each dsv4_*.go adds
// its own from init), so that DeepSeek-V4's ops are handed out together, once all are there.
var dsv4Fills []func(b *Backend, o *backend.DSV4Ops)

// dsv4Ops returns DeepSeek-V4's ops, nil while any member is missing.
func dsv4Ops(b *Backend) *backend.DSV4Ops {
	o := &backend.DSV4Ops{}
	for _, f := range dsv4Fills {
		f(b, o)
	}
	if ok, _ := o.Complete(); !ok {
		return nil
	}
	return o
}

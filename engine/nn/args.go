package nn

import "github.com/halo-shell/halo-shell/engine/backend"

func backendLinearArgs(dx, dw, db, dy, x, w T, acc bool) backend.LinearBackwardArgs {
	return backend.LinearBackwardArgs{DX: dx, DW: dw, DB: db, DY: dy, X: x, W: w, AccumulateDX: acc}
}

// Package nbrun executes Jupyter notebooks headless: it reads an nbformat 4 notebook, starts a
// kernel as Jupyter does (a child process given a connection file), sends each code cell in
// order as an execute_request over the Jupyter wire protocol (ZeroMQ, HMAC-SHA256 signed), and
// records what the kernel publishes as nbformat outputs: stream (consecutive writes to one
// stream merged), execute_result, display_data with every MIME type of its bundle (display
// updates applied in place, clear_output honoured) and error with ename, evalue and traceback,
// plus each cell's execution_count. It stops at the first failing cell unless told to go on,
// interrupts a cell that runs past its timeout (interrupt_request on the control channel) and
// then fails naming the cell, honours nbclient's cell tags (skip-execution, raises-exception)
// and records its per-cell timings, and writes the executed notebook as nbformat does (one-space
// indent, sorted keys, multiline strings as lists of lines), keeping the notebook's and cells'
// metadata and ids.
//
// It is what `halo-shell notebook run` does, so that machines without Python's nbclient
// (teaching machines, a GPU machine where nothing can be installed) run the lecture
// notebooks, and it drives the same kernel process the kernelspec starts, through the same
// sockets.
//
// The package is a Jupyter client, not the kernel (package kernel) and not the message
// framing (kernel/internal/wire, which it shares with the kernel).
package nbrun

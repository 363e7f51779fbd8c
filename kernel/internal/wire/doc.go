// Package wire is the Jupyter messaging protocol (version 5.3) at the level of bytes: the
// connection file, the multipart wire format of a message (routing identities, the
// "<IDS|MSG>" delimiter, an HMAC-SHA256 signature, then the header, parent header, metadata and
// content as JSON, then binary buffers), and signing and verification.
//
// It is not the kernel: it opens no sockets and knows nothing about message types beyond the
// header that every message carries. Parse never panics on bad input; it returns an error that
// says which frame is wrong and why, and ErrBadSignature (wrapped) when the signature does not
// match, so that the caller can drop the message and log it.
package wire

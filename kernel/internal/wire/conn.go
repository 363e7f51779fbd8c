package wire

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
)

// maxConnectionFile bounds the size of a connection file; real ones are a few hundred bytes.
const maxConnectionFile = 1 << 20

// ConnectionInfo is the content of a Jupyter connection file: where the kernel's five sockets
// listen and how messages are signed.
type ConnectionInfo struct {
	Transport       string `json:"transport"`
	IP              string `json:"ip"`
	ShellPort       int    `json:"shell_port"`
	ControlPort     int    `json:"control_port"`
	StdinPort       int    `json:"stdin_port"`
	IOPubPort       int    `json:"iopub_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name,omitempty"`
}

// ReadConnectionFile reads and validates a connection file.
func ReadConnectionFile(path string) (*ConnectionInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("wire: connection file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConnectionFile+1))
	if err != nil {
		return nil, fmt.Errorf("wire: connection file %s: %w", path, err)
	}
	if len(b) > maxConnectionFile {
		return nil, fmt.Errorf("wire: connection file %s: larger than %d bytes; is it a connection file?", path, maxConnectionFile)
	}
	ci, err := ParseConnectionInfo(b)
	if err != nil {
		return nil, fmt.Errorf("wire: connection file %s: %w", path, err)
	}
	return ci, nil
}

// ParseConnectionInfo decodes and validates the JSON of a connection file.
func ParseConnectionInfo(b []byte) (*ConnectionInfo, error) {
	var ci ConnectionInfo
	if err := json.Unmarshal(b, &ci); err != nil {
		return nil, fmt.Errorf("not valid JSON: %v", err)
	}
	if err := ci.Validate(); err != nil {
		return nil, err
	}
	return &ci, nil
}

// Validate checks the transport, address, ports and signature scheme.
func (c *ConnectionInfo) Validate() error {
	switch c.Transport {
	case "tcp":
		if net.ParseIP(c.IP) == nil && c.IP != "localhost" && c.IP != "*" {
			return fmt.Errorf("key \"ip\": %q is not an IP address", c.IP)
		}
		ports := []struct {
			name string
			p    int
		}{{"shell_port", c.ShellPort}, {"control_port", c.ControlPort}, {"stdin_port", c.StdinPort},
			{"iopub_port", c.IOPubPort}, {"hb_port", c.HBPort}}
		for _, p := range ports {
			if p.p <= 0 || p.p > 65535 {
				return fmt.Errorf("key %q: port %d out of range 1..65535", p.name, p.p)
			}
		}
	case "ipc":
		if c.IP == "" {
			return fmt.Errorf("key \"ip\": empty; for transport ipc it is the socket path prefix")
		}
	case "":
		return fmt.Errorf("key \"transport\" missing; want \"tcp\" or \"ipc\"")
	default:
		return fmt.Errorf("key \"transport\": %q is not supported; want \"tcp\" or \"ipc\"", c.Transport)
	}
	switch strings.ToLower(c.SignatureScheme) {
	case "hmac-sha256":
	case "":
		if c.Key != "" {
			return fmt.Errorf("key \"signature_scheme\" missing while \"key\" is set; want \"hmac-sha256\"")
		}
	default:
		return fmt.Errorf("key \"signature_scheme\": %q is not supported; want \"hmac-sha256\"", c.SignatureScheme)
	}
	return nil
}

// Endpoint is the ZeroMQ address of a port ("tcp://127.0.0.1:5555", or "ipc://PATH-5555").
func (c *ConnectionInfo) Endpoint(port int) string {
	if c.Transport == "ipc" {
		return fmt.Sprintf("ipc://%s-%d", c.IP, port)
	}
	ip := c.IP
	if strings.Contains(ip, ":") {
		ip = "[" + ip + "]"
	}
	return fmt.Sprintf("%s://%s:%d", c.Transport, ip, port)
}

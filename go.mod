module github.com/halo-shell/halo-shell

go 1.26.0

require github.com/spf13/cobra v1.10.2

require (
	connectrpc.com/connect/v2 v2.0.2
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/dlclark/regexp2 v1.12.0
	github.com/ebitengine/purego v0.11.3 // indirect
	github.com/goccy/go-yaml v1.19.2 // indirect
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/text v0.44.0
)

module github.com/oncekey/oncekey/idempotency/grpcidem

go 1.26.0

require (
	github.com/oncekey/oncekey/idempotency v0.1.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260706201446-f0a921348800
	google.golang.org/grpc v1.84.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/gowebpki/jcs v1.0.2 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace github.com/oncekey/oncekey/idempotency => ../

module github.com/oncekey/oncekey/examples/transfers

go 1.26.0

replace github.com/oncekey/oncekey/idempotency => ../../idempotency

replace github.com/oncekey/oncekey/idempotency/pgstore => ../../idempotency/pgstore

replace github.com/oncekey/oncekey/idempotency/grpcidem => ../../idempotency/grpcidem

require (
	github.com/jackc/pgx/v5 v5.13.0
	github.com/oncekey/oncekey/idempotency v0.1.0
	github.com/oncekey/oncekey/idempotency/grpcidem v0.0.0-00010101000000-000000000000
	github.com/oncekey/oncekey/idempotency/pgstore v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

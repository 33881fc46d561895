module github.com/oncekey/oncekey/idempotency/integration

go 1.26.0

require (
	github.com/jackc/pgx/v5 v5.13.0
	github.com/oncekey/oncekey/idempotency v0.1.0
	github.com/oncekey/oncekey/idempotency/pgstore v0.1.0
	github.com/oncekey/oncekey/idempotency/redisstore v0.1.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/stretchr/testify v1.12.1
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260706201446-f0a921348800
	google.golang.org/grpc v1.84.0
	google.golang.org/protobuf v1.36.12
)

require golang.org/x/net v0.62.0 // indirect

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/oncekey/oncekey/idempotency/grpcidem v0.1.0
	github.com/sony/gobreaker/v2 v2.4.0 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

replace (
	github.com/oncekey/oncekey/idempotency => ../
	github.com/oncekey/oncekey/idempotency/pgstore => ../pgstore
	github.com/oncekey/oncekey/idempotency/redisstore => ../redisstore
)

replace github.com/oncekey/oncekey/idempotency/grpcidem => ../grpcidem

module github.com/oncekey/oncekey/idempotency/redisstore

go 1.25.0

require (
	github.com/oncekey/oncekey/idempotency v0.1.0
	github.com/redis/go-redis/v9 v9.22.0
	github.com/sony/gobreaker/v2 v2.4.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	go.uber.org/atomic v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.44.0 // indirect
)

replace github.com/oncekey/oncekey/idempotency => ../

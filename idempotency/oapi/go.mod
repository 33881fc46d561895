module github.com/oncekey/oncekey/idempotency/oapi

go 1.25.0

require (
	github.com/getkin/kin-openapi v0.149.0
	github.com/go-chi/chi/v5 v5.5.0
	github.com/oncekey/oncekey/idempotency v0.1.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/go-openapi/jsonpointer v0.22.5 // indirect
	github.com/go-openapi/swag/jsonname v0.25.5 // indirect
	github.com/gowebpki/jcs v1.0.2 // indirect
	github.com/kr/pretty v0.3.1 // indirect
	github.com/oasdiff/yaml v0.1.1 // indirect
	github.com/oasdiff/yaml3 v0.0.14 // indirect
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/text v0.41.0 // indirect
)

replace github.com/oncekey/oncekey/idempotency => ../

// Package oncekey holds the assets every part of the service is built from:
// the OpenAPI contract and the database migrations. They live at the module
// root because they are the source of truth that gen/ is generated from, and
// are embedded here so that one binary carries exactly the contract and schema
// it was built with.
package oncekey

import "embed"

//go:generate go tool oapi-codegen -config gen/api/oapi-codegen.yaml openapi.yaml
//go:generate go tool oapi-codegen -config gen/apiserver/oapi-codegen.yaml openapi.yaml
//go:generate go tool oapi-codegen -config gen/apiclient/oapi-codegen.yaml openapi.yaml
//go:generate go tool oapi-codegen -config client/internal/released/oapi-codegen.yaml api/openapi.released.yaml
//go:generate go tool -modfile=tools/go.mod sqlc generate

// OpenAPISpec is openapi.yaml, served at GET /openapi.yaml and used to
// validate every request before a handler runs.
//
//go:embed openapi.yaml
var OpenAPISpec []byte

// Migrations holds the numbered goose migrations in schema/.
//
//go:embed schema/*.sql
var Migrations embed.FS

// ConformanceOverrides is api/conformance.yaml: what `oncekey conformance`
// needs besides openapi.yaml to check Oncekey itself (the orders, payments
// and refunds that its operations act on).
//
//go:embed api/conformance.yaml
var ConformanceOverrides []byte

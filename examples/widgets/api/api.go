// Package api is the code oapi-codegen generates from ../openapi.yaml: the
// models and the chi strict server.
package api

//go:generate go tool oapi-codegen -config oapi-codegen.yaml ../openapi.yaml

//go:build !unix

package httpserver

func openFileLimit() int { return 0 }

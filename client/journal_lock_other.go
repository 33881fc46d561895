//go:build !unix

package client

import (
	"context"
	"fmt"
	"os"
)

// lockFile only opens path where flock is not available: the journal
// works, but two processes on one journal are not kept apart there, which
// is why it is meant for unix systems.
func lockFile(_ context.Context, path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("client: journal lock: %w", err)
	}
	return f, nil
}

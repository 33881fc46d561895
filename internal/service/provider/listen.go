package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Listen serves srv on addr (such as "127.0.0.1:0" for any free port) in a
// goroutine and returns its base URL, with the real port, and a stop
// function. It lets Oncekey's serve run the sandbox in-process when no
// external provider is configured.
//
// ctx bounds only the listening; the server runs until stop is called.
// stop shuts down gracefully within its context's deadline, dropping at
// once the answers that timeout faults are holding (they would otherwise
// hold the shutdown for TimeoutHold), and closes every connection if the
// deadline passes. Calling stop again returns the first call's result.
func Listen(ctx context.Context, addr string, srv *Server, logger *slog.Logger) (baseURL string, stop func(context.Context) error, err error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("provider: listen on %s: %w", addr, err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	hs.RegisterOnShutdown(srv.releaseHeld)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			logger.Error("fakeprovider: serve", "error", err)
		}
	}()

	var (
		once    sync.Once
		stopErr error
	)
	stop = func(ctx context.Context) error {
		once.Do(func() {
			stopErr = hs.Shutdown(ctx)
			if stopErr != nil {
				_ = hs.Close()
			}
			<-served
		})
		return stopErr
	}
	return "http://" + ln.Addr().String(), stop, nil
}

package httpserver_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/oncekey/oncekey/internal/service/httpserver"
)

func ExampleServe() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background()) // signal.NotifyContext in a command
	served := make(chan error, 1)
	go func() {
		served <- httpserver.Serve(ctx, ln, httpserver.Config{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The body is here already, read in full under the body
				// deadline before the handler was called.
				body, _ := io.ReadAll(r.Body)
				fmt.Fprintf(w, "got %d bytes", len(body))
			}),
			MaxBodyBytes:    64 << 10,
			ShutdownTimeout: 5 * time.Second,
			Logger:          slog.New(slog.DiscardHandler),
		})
	}()

	resp, err := http.Post("http://"+ln.Addr().String(), "application/json", strings.NewReader(`{"items":[]}`))
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	fmt.Println(resp.Status, string(body))

	stop() // SIGTERM: the idle keep-alive connection is closed at once
	fmt.Println("shutdown:", <-served)
	// Output:
	// 200 OK got 12 bytes
	// shutdown: <nil>
}

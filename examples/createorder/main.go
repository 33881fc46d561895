// Command createorder creates one order through the Go SDK, exactly once
// however flaky the network: run it against `make run`.
//
//	ONCEKEY_URL=http://127.0.0.1:8080 ONCEKEY_API_KEY=ok_local_demo go run ./examples/createorder
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
)

func main() {
	if err := run(context.Background(), os.Getenv, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// errNoServer names what the example reads, and what `make run` serves.
var errNoServer = errors.New("set ONCEKEY_URL and ONCEKEY_API_KEY: the server and an API key, " +
	"e.g. ONCEKEY_URL=http://127.0.0.1:8080 ONCEKEY_API_KEY=ok_local_demo for `make run`")

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	url, key := getenv("ONCEKEY_URL"), getenv("ONCEKEY_API_KEY")
	if url == "" || key == "" {
		return errNoServer
	}
	c, err := client.New(client.Config{BaseURL: url, APIKey: key})
	if err != nil {
		return err
	}
	order, err := c.CreateOrder(ctx, api.NewOrder{
		Items:    []api.OrderItem{{Sku: "SKU-1", Qty: 2}},
		Amount:   1200,
		Currency: "RUB",
	})
	if err != nil {
		return fmt.Errorf("create an order at %s (ONCEKEY_URL): %w", url, err) // a *client.ProblemError carries the RFC 9457 problem
	}
	_, err = fmt.Fprintln(stdout, "created order", order.Id, order.Status)
	return err
}

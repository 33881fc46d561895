// Command createorder creates one order through the Go SDK, exactly once
// however flaky the network: run it against `make run`.
//
//	ONCEKEY_URL=http://localhost:8080 ONCEKEY_API_KEY=ok_try_me go run ./examples/createorder
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/oncekey/oncekey/client"
	"github.com/oncekey/oncekey/gen/api"
)

func main() {
	c, err := client.New(client.Config{BaseURL: os.Getenv("ONCEKEY_URL"), APIKey: os.Getenv("ONCEKEY_API_KEY")})
	if err != nil {
		log.Fatal(err)
	}
	order, err := c.CreateOrder(context.Background(), api.NewOrder{
		Items:    []api.OrderItem{{Sku: "SKU-1", Qty: 2}},
		Amount:   1200,
		Currency: "RUB",
	})
	if err != nil {
		log.Fatal(err) // a *client.ProblemError carries the RFC 9457 problem
	}
	fmt.Println("created order", order.Id, order.Status)
}

package main

import (
	"context"
	"os/signal"
	"syscall"

	flo "github.com/razorbill/flo-go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	client := flo.NewClient("localhost:9000", flo.WithNamespace("myapp"))
	client.Connect()
	defer client.Close()

	w, _ := client.NewActionWorker(flo.ActionWorkerOptions{
		Concurrency: 10,
	})
	defer w.Close()

	w.MustRegisterAction("process-order", func(actx *flo.ActionContext) ([]byte, error) {
		var order map[string]interface{}
		actx.Into(&order)
		// Process the order...
		return actx.Bytes(map[string]string{"status": "done"})
	})

	w.MustRegisterAction("send-email", func(actx *flo.ActionContext) ([]byte, error) {
		// Send the email...
		return nil, nil
	})

	// Blocks until context is cancelled or drain completes
	w.Start(ctx)
}

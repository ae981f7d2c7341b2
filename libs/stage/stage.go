// Package stage runs a service's long-running components in stages and stops
// them in the reverse order. A service lists its stages in start order (HTTP
// probes, the outbox relay, background work, consumers, the gRPC server,
// readiness); when its context ends or a component fails, the last stage
// stops first, so each stage stops while everything it relies on still runs:
// readiness goes off (and the service keeps serving a while, so load
// balancers notice), gRPC drains in-flight calls, consumers commit, work
// finishes, the relay flushes, and the probes answer until the end.
package stage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/razorbill/flo/libs/grpcserver"
)

// Stage is a set of components that start together and stop together.
type Stage struct {
	name       string
	components []component
	stop       func(ctx context.Context)
}

type component struct {
	name string
	run  func(ctx context.Context) error
}

// New returns an empty stage; name appears in logs.
func New(name string) *Stage { return &Stage{name: name} }

// Go adds a component. run gets a context that ends when the stage stops and
// should return nil then; an error it returns at any time stops the service.
func (s *Stage) Go(name string, run func(ctx context.Context) error) *Stage {
	s.components = append(s.components, component{name: name, run: run})
	return s
}

// OnStop sets what stopping the stage does before its context is cancelled:
// stopping servers that do not watch a context, flushing buffers, turning
// readiness off. fn gets a context carrying the Run context's values without
// its cancellation; it should bound its own waiting.
func (s *Stage) OnStop(fn func(ctx context.Context)) *Stage {
	s.stop = fn
	return s
}

// GRPC is a stage serving srv on lis; stopping it lets in-flight calls finish
// for up to timeout (grpcserver.Stop).
func GRPC(srv *grpc.Server, lis net.Listener, timeout time.Duration, log *slog.Logger) *Stage {
	log = orDiscard(log)
	return New("grpc").
		Go("grpc server", func(context.Context) error { return srv.Serve(lis) }).
		OnStop(func(context.Context) { grpcserver.Stop(srv, timeout, log) })
}

// HTTP is a stage serving srv on lis; stopping it shuts srv down gracefully,
// waiting up to timeout for open requests.
func HTTP(srv *http.Server, lis net.Listener, timeout time.Duration, log *slog.Logger) *Stage {
	log = orDiscard(log)
	return New("http").
		Go("http server", func(context.Context) error {
			if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}).
		OnStop(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				log.WarnContext(ctx, "stop http server", "error", err)
			}
		})
}

// Listen opens a service's gRPC and HTTP listeners, so their addresses are
// known before it serves. On failure neither stays open.
func Listen(grpcAddr, httpAddr string) (grpcLis, httpLis net.Listener, err error) {
	if grpcLis, err = net.Listen("tcp", grpcAddr); err != nil {
		return nil, nil, fmt.Errorf("listen grpc on %s: %w", grpcAddr, err)
	}
	if httpLis, err = net.Listen("tcp", httpAddr); err != nil {
		_ = grpcLis.Close()
		return nil, nil, fmt.Errorf("listen http on %s: %w", httpAddr, err)
	}
	return grpcLis, httpLis, nil
}

// Readiness is the stage to list last, so that it stops first: stopping it
// calls off, which turns the service's readiness off, and then keeps every
// other stage serving for delay, so that load balancers and Kubernetes
// endpoints stop sending work before the service stops taking it.
func Readiness(delay time.Duration, off func(), log *slog.Logger) *Stage {
	log = orDiscard(log)
	return New("readiness").OnStop(func(ctx context.Context) {
		off()
		log.InfoContext(ctx, "stopping: readiness off", "serving_for", delay)
		if delay > 0 {
			time.Sleep(delay)
		}
	})
}

// Run starts every stage's components, first stage first, and waits until ctx
// ends or a component fails. Then it stops the stages last to first: for each,
// its OnStop, then its context is cancelled and its components are waited
// for. It returns the first component error, or nil when ctx ended.
func Run(ctx context.Context, log *slog.Logger, stages ...*Stage) error {
	log = orDiscard(log)
	// Components outlive ctx: they stop when their stage is stopped.
	base := context.WithoutCancel(ctx)
	errc := make(chan error, 1)
	type running struct {
		cancel context.CancelFunc
		wg     sync.WaitGroup
	}
	runs := make([]*running, len(stages))
	for i, st := range stages {
		r := &running{}
		var stageCtx context.Context
		stageCtx, r.cancel = context.WithCancel(base)
		runs[i] = r
		for _, c := range st.components {
			r.wg.Go(func() {
				err := c.run(stageCtx)
				if err == nil {
					return
				}
				err = fmt.Errorf("%s: %w", c.name, err)
				select {
				case errc <- err:
				default:
					// Another component failed first; the service is
					// stopping already.
					log.WarnContext(base, "component failed while stopping", "component", c.name, "error", err)
				}
			})
		}
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		log.ErrorContext(base, "component failed; stopping", "error", runErr)
	}

	for i := len(stages) - 1; i >= 0; i-- {
		if stages[i].stop != nil {
			stages[i].stop(base)
		}
		runs[i].cancel()
		runs[i].wg.Wait()
	}
	select {
	case err := <-errc:
		log.WarnContext(base, "component failed while stopping", "error", err)
	default:
	}
	return runErr
}

func orDiscard(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}

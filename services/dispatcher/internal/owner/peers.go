package owner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	dispatcherv1 "github.com/razorbill/flo/proto/gen/flo/dispatcher/v1"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// forwardedKey marks a call one replica passed to the owner, which must not
// pass it on again.
const forwardedKey = "x-flo-forwarded"

// ownersMaxAge bounds how stale the cached owners table may be when a
// partition's owner is not in it.
const ownersMaxAge = 200 * time.Millisecond

// unassignedWait bounds how long a call waits for its partition to get an
// owner (during a rebalance) before it fails as unavailable.
const unassignedWait = 10 * time.Second

// forwardTimeout bounds one call passed to an owner, which may wait up to
// unseenWait itself: an owner that does not answer (paused past its
// session, cut off) is given up on and the call tried where the owners
// table then points, instead of holding the caller until its deadline.
const forwardTimeout = 2 * unseenWait

// forwarded reports whether the call in ctx was passed on by another replica.
func forwarded(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(forwardedKey)) > 0
}

// Peers reaches the replicas that own other partitions.
type Peers struct {
	r    *Replica
	dial []grpc.DialOption
	log  *slog.Logger

	mu      sync.Mutex
	owners  map[int32]view.Owner
	readAt  time.Time
	clients map[string]*grpc.ClientConn
}

// NewPeers returns Peers dialing with dial (the internal credentials).
func NewPeers(r *Replica, dial []grpc.DialOption, log *slog.Logger) *Peers {
	return &Peers{r: r, dial: dial, log: log, owners: map[int32]view.Owner{}, clients: map[string]*grpc.ClientConn{}}
}

// Close closes the connections to peers.
func (p *Peers) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.clients {
		_ = c.Close()
		delete(p.clients, addr)
	}
}

// Replicas lists the replicas that own partitions, from the owners table.
func (p *Peers) Replicas(ctx context.Context) ([]*dispatcherv1.Replica, error) {
	owners, err := view.Owners(ctx, p.r.pool)
	if err != nil {
		return nil, err
	}
	byAddr := map[string]*dispatcherv1.Replica{}
	var out []*dispatcherv1.Replica
	for _, o := range owners {
		rep := byAddr[o.Address]
		if rep == nil {
			rep = &dispatcherv1.Replica{Address: o.Address}
			byAddr[o.Address] = rep
			out = append(out, rep)
		}
		rep.Partitions = append(rep.Partitions, o.Partition)
	}
	slices.SortFunc(out, func(a, b *dispatcherv1.Replica) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}

// Route calls local when this replica owns the partition of taskID, and
// otherwise remote with a client of the owner and a context marking the
// call as forwarded. A call that finds the partition moved is tried again
// at the new owner; a forwarded call is never forwarded again.
func (p *Peers) Route(ctx context.Context, taskID string, local func(context.Context) error,
	remote func(context.Context, dispatcherv1.DispatcherClient) error) error {
	return p.RoutePartition(ctx, p.r.PartitionOf(taskID), local, remote)
}

// RoutePartition is Route for a partition.
func (p *Peers) RoutePartition(ctx context.Context, part int32, local func(context.Context) error,
	remote func(context.Context, dispatcherv1.DispatcherClient) error) error {
	deadline := time.Now().Add(unassignedWait)
	passedOn := forwarded(ctx)
	for refresh := false; ; refresh = true {
		if p.r.Owns(part) {
			err := local(ctx)
			if !isNotOwner(err) {
				return err
			}
		}
		if passedOn {
			return ErrNotOwner
		}
		c, err := p.client(ctx, part, refresh)
		if err != nil {
			return err
		}
		if c != nil {
			fctx, cancel := context.WithTimeout(ctx, forwardTimeout)
			err := remote(metadata.AppendToOutgoingContext(fctx, forwardedKey, "1"), dispatcherv1.NewDispatcherClient(c))
			cancel()
			silent := status.Code(err) == codes.DeadlineExceeded && ctx.Err() == nil
			if status.Code(err) != codes.Aborted && !silent {
				return err
			}
		}
		// No owner yet, it just lost the partition, or it does not answer:
		// a rebalance is on.
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: task partition %d has no owner; the dispatcher replicas are rebalancing", ErrUnavailable, part)
		}
		t := time.NewTimer(ownersMaxAge)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// client returns a connection to the owner of part, nil when the owners
// table names no other replica for it.
func (p *Peers) client(ctx context.Context, part int32, refresh bool) (*grpc.ClientConn, error) {
	p.mu.Lock()
	o, ok := p.owners[part]
	stale := time.Since(p.readAt) > ownersMaxAge
	p.mu.Unlock()
	if !ok || refresh && stale {
		owners, err := view.Owners(ctx, p.r.pool)
		if err != nil {
			return nil, fmt.Errorf("read partition owners: %w", err)
		}
		p.mu.Lock()
		p.owners = make(map[int32]view.Owner, len(owners))
		for _, o := range owners {
			p.owners[o.Partition] = o
		}
		p.readAt = time.Now()
		o, ok = p.owners[part]
		p.mu.Unlock()
	}
	if !ok || o.Address == p.r.cfg.Address {
		return nil, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[o.Address]; c != nil {
		return c, nil
	}
	c, err := grpc.NewClient(o.Address, append(slices.Clip(p.dial), grpc.WithStatsHandler(otelgrpc.NewClientHandler()))...)
	if err != nil {
		return nil, fmt.Errorf("dial dispatcher replica %s: %w", o.Address, err)
	}
	p.clients[o.Address] = c
	return c, nil
}

package owner

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/razorbill/flo/libs/kafka"
	"github.com/razorbill/flo/services/dispatcher/internal/view"
)

// A replica killed without leaving the group (SIGKILL, out of memory, a
// crash) keeps its partitions until its session runs out, and their tasks
// wait: claims find nothing there, reports fail. Its peers notice sooner:
// once nothing listens at its address any more, a peer removes its member
// from the group, which moves the partitions at once. A replica that is
// only paused (SIGSTOP, a long stall) still accepts connections and is
// left to its session, as is one whose host vanished (a dial that times
// out proves nothing).
const (
	// peerCheckEvery spaces the checks of the peers' addresses.
	peerCheckEvery = time.Second
	// refusedFor is how long a peer's address must refuse connections
	// before the peer is removed; a peer that stops gracefully closes its
	// listener shortly before it leaves the group itself.
	refusedFor = time.Second
	// dialWait bounds one check's connection attempt.
	dialWait = 500 * time.Millisecond
)

// watchPeers checks the addresses of the replicas the owners table names
// until ctx ends, and removes from the group the member of any whose
// address refused connections for refusedFor, or is this replica's own
// (a predecessor on the same address). Each replica is removed at
// most once: a live one whose advertised address is wrong rejoins, and is
// then left to its session.
func (r *Replica) watchPeers(ctx context.Context) {
	t := time.NewTicker(peerCheckEvery)
	defer t.Stop()
	refusedSince := map[string]time.Time{}
	evicted := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owners, err := view.Owners(ctx, r.pool)
		if err != nil {
			continue
		}
		peers := map[string]view.Owner{}
		for _, o := range owners {
			if o.Replica != r.cfg.ReplicaID && o.Member != "" && !evicted[o.Replica] {
				peers[o.Replica] = o
			}
		}
		for id := range refusedSince {
			if _, ok := peers[id]; !ok {
				delete(refusedSince, id)
			}
		}
		for id, o := range peers {
			// A replica restarted in place (same address, new replica id)
			// knows its predecessor is gone without asking.
			why := "this replica listens at its address now"
			if o.Address != r.cfg.Address {
				if !refused(ctx, o.Address) {
					delete(refusedSince, id)
					continue
				}
				since, ok := refusedSince[id]
				if !ok {
					refusedSince[id] = time.Now()
					continue
				}
				if time.Since(since) < refusedFor {
					continue
				}
				why = "its address refused connections for " + time.Since(since).Round(time.Millisecond).String()
			}
			delete(refusedSince, id)
			evicted[id] = true
			removed, err := r.evict(ctx, o.Member)
			if err != nil {
				r.log.WarnContext(ctx, "could not remove a replica that no longer listens from the group; its session ends it", "replica", id, "address", o.Address, "error", err)
			}
			if !removed {
				continue
			}
			r.metrics.evicted.Add(ctx, 1)
			r.log.WarnContext(ctx, "removed from the group a replica that no longer listens at its address, so its partitions move now",
				"replica", id, "address", o.Address, "member", o.Member, "why", why)
		}
	}
}

// refused reports whether a connection to addr was refused: nothing
// listens there.
func refused(ctx context.Context, addr string) bool {
	dctx, cancel := context.WithTimeout(ctx, dialWait)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return errors.Is(err, syscall.ECONNREFUSED)
	}
	_ = c.Close()
	return false
}

// evict removes member from the dispatchers' group, and reports whether it
// was there (a replica that stopped gracefully left by itself).
func (r *Replica) evict(ctx context.Context, member string) (bool, error) {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = kafka.DispatcherGroup
	// Versions before 3 name one member here, later ones in Members.
	req.MemberID = member
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = member
	reason := "nothing listens at the replica's address any more"
	m.Reason = &reason
	req.Members = append(req.Members, m)
	resp, err := req.RequestWith(ctx, r.admin)
	if err != nil {
		return false, fmt.Errorf("leave group for %s: %w", member, err)
	}
	codes := []int16{resp.ErrorCode}
	for _, mr := range resp.Members {
		codes = append(codes, mr.ErrorCode)
	}
	for _, code := range codes {
		switch err := kerr.ErrorForCode(code); {
		case errors.Is(err, kerr.UnknownMemberID):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("leave group for %s: %w", member, err)
		}
	}
	return true, nil
}

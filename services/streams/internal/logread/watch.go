package logread

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/razorbill/flo/libs/retry"
)

// watchWait is how long one long-poll fetch of the watcher waits for
// records. A broker answers the requests of one connection in order, so a
// long poll holds up whatever follows it on its connection: the watcher has
// a client of its own, and one round covers every watched stream, which
// starts being watched at the next round, at most this long after.
const watchWait = 500 * time.Millisecond

// watched is one stream being watched and by how many.
type watched struct {
	refs       int
	partitions int32
}

// Watch makes sure records appended to topic (with partitions partitions)
// beyond what this replica knows are noticed without polling the database:
// while at least one caller holds a watch, the watcher's long-polling fetch
// waits at the known ends of the topic's partitions, and whatever it
// returns advances them (and calls onAdvance). Records appended through this
// replica advance them at once. The returned function releases the watch.
func (r *Reader) Watch(topic string, partitions int32) (release func()) {
	r.mu.Lock()
	w := r.watches[topic]
	if w == nil {
		w = &watched{partitions: partitions}
		r.watches[topic] = w
	}
	w.refs++
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		w.refs--
		if w.refs == 0 && r.watches[topic] == w {
			delete(r.watches, topic)
		}
	}
}

// Run runs the watcher until ctx ends.
func (r *Reader) Run(ctx context.Context) error {
	b := watchRetry.Backoff()
	for {
		r.mu.Lock()
		topics := make(map[string]int32, len(r.watches))
		for t, w := range r.watches {
			topics[t] = w.partitions
		}
		r.mu.Unlock()
		if len(topics) == 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-r.kick:
			}
			continue
		}
		err := r.watchRound(ctx, topics)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			b.Reset()
			continue
		}
		r.log.DebugContext(ctx, "stream watch failed; retrying", "error", err)
		if !retry.Sleep(ctx, b.NextBackOff()) {
			return nil
		}
	}
}

// watchRetry is how the watcher waits after a failed round.
var watchRetry = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}

// watchRound long-polls every watched topic once, from the known ends.
func (r *Reader) watchRound(ctx context.Context, topics map[string]int32) error {
	byLeader := map[int32]*kmsg.FetchRequest{}
	from := map[string][]int64{}
	for topic, partitions := range topics {
		ends := r.known(topic, partitions)
		for _, e := range ends {
			if e < 0 {
				// Learn the ends first; ListEnds advances them.
				var err error
				if ends, err = r.ListEnds(ctx, topic, partitions); err != nil {
					return err
				}
				break
			}
		}
		meta, err := r.topic(ctx, topic)
		if err != nil {
			return err
		}
		from[topic] = ends
		for p := range partitions {
			if int(p) >= len(meta.leaders) || meta.leaders[p] < 0 {
				r.forgetTopic(topic)
				return fmt.Errorf("topic %s partition %d has no leader", topic, p)
			}
			req := byLeader[meta.leaders[p]]
			if req == nil {
				req = newFetchRequest(watchWait)
				byLeader[meta.leaders[p]] = req
			}
			if len(req.Topics) == 0 || req.Topics[len(req.Topics)-1].Topic != topic {
				rt := kmsg.NewFetchRequestTopic()
				rt.Topic, rt.TopicID = topic, meta.id
				req.Topics = append(req.Topics, rt)
			}
			rt := &req.Topics[len(req.Topics)-1]
			rt.Partitions = append(rt.Partitions, fetchPartition(p, ends[p], minPartitionBytes))
		}
	}
	errs := make(chan error, len(byLeader))
	for leader, req := range byLeader {
		go func() {
			resp, err := req.RequestWith(ctx, r.watchCl.Broker(int(leader)))
			if err == nil {
				err = kerr.ErrorForCode(resp.ErrorCode)
			}
			if err != nil {
				errs <- fmt.Errorf("watch fetch from broker %d: %w", leader, err)
				return
			}
			for _, t := range resp.Topics {
				for i := range t.Partitions {
					rp := &t.Partitions[i]
					ends := from[t.Topic]
					if ends == nil || int(rp.Partition) >= len(ends) {
						continue
					}
					if _, _, _, err := r.take(t.Topic, ends[rp.Partition], rp); err != nil {
						r.forgetTopic(t.Topic)
					}
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range byLeader {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

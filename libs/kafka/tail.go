package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Tail reads topics from their current end without a consumer group, so
// every replica sees every record. It is meant for in-memory wake-ups such
// as "task X finished", where history does not matter.
type Tail struct {
	cl     *kgo.Client
	topics []string
	h      BatchHandler
	log    *slog.Logger
	ready  chan struct{}
}

// NewTail returns a tail over topics; nothing is read until Run.
func NewTail(brokers []string, topics []string, h BatchHandler, log *slog.Logger) (*Tail, error) {
	if len(topics) == 0 {
		// kadm would list every topic of the cluster instead.
		return nil, errors.New("new tail: no topics")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// No topic auto-creation: a reader must not create a topic with
	// whatever defaults the broker has, and Ready then means the same with
	// a dev broker as with a production one.
	cl, err := newClient(brokers, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	if err != nil {
		return nil, fmt.Errorf("new tail: %w", err)
	}
	return &Tail{cl: cl, topics: topics, h: h, log: log.With("tail", topics), ready: make(chan struct{})}, nil
}

// Run looks up the end offset of every partition of the topics (waiting, with
// a log line now and then, until all topics exist), closes Ready, then hands
// every record from those offsets on to the handler, partition batch by
// partition batch, retrying a failing batch with backoff. It returns nil when
// ctx ends and closes the client.
func (t *Tail) Run(ctx context.Context) error {
	defer t.cl.Close()
	start, err := t.endOffsets(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	t.cl.AddConsumePartitions(start)
	close(t.ready)
	for {
		fetches := t.cl.PollRecords(ctx, maxPollRecords)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		logFetchErrors(ctx, t.log, fetches)
		stopped := false
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if stopped || len(p.Records) == 0 {
				return
			}
			stopped = !handleWithRetry(ctx, t.log, t.h, p.Records)
		})
		if stopped {
			return nil
		}
	}
}

// Ready is closed by Run once it knows the end offset of every partition of
// every topic and consumes from exactly there: any record whose produce was
// acknowledged after Ready closed reaches the handler (records produced
// before may too). The tail never creates topics, so Ready stays open while
// a topic does not exist yet (call EnsureTopics first to not depend on the
// producing service), and forever if Run is never called or ends first.
func (t *Tail) Ready() <-chan struct{} { return t.ready }

// endOffsets lists the current end offsets, retrying until every topic
// exists or ctx ends.
func (t *Tail) endOffsets(ctx context.Context) (map[string]map[int32]kgo.Offset, error) {
	adm := kadm.NewClient(t.cl)
	delay := retryMin
	for attempt := 1; ; attempt++ {
		listed, err := adm.ListEndOffsets(ctx, t.topics...)
		if err == nil {
			err = listed.Error()
		}
		if err == nil {
			start := make(map[string]map[int32]kgo.Offset, len(t.topics))
			for _, topic := range t.topics {
				ps, ok := listed[topic]
				if !ok || len(ps) == 0 {
					err = fmt.Errorf("topic %s: no partitions", topic)
					break
				}
				start[topic] = make(map[int32]kgo.Offset, len(ps))
				for p, o := range ps {
					start[topic][p] = kgo.NewOffset().At(o.Offset)
				}
			}
			if err == nil {
				return start, nil
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if attempt == 1 || attempt%10 == 0 {
			t.log.InfoContext(ctx, "tail waiting for topics", "attempt", attempt, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil, errors.Join(ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

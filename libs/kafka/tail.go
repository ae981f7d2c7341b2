package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/razorbill/flo/libs/retry"

	"github.com/razorbill/flo/libs/config"
)

// Tail reads topics from their current end without a consumer group, so
// every replica sees every record. It is meant for in-memory wake-ups such
// as "task X finished", where history does not matter.
type Tail struct {
	cl     *kgo.Client
	topics []string
	h      *isolator
	log    *slog.Logger
	ready  chan struct{}
}

// topicWait is how often a tail asks again for the end offsets of topics
// that do not exist yet.
var topicWait = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}

// NewTail returns a tail over topics; nothing is read until Run. h runs
// behind the same chain as a Consumer's handler, but a record it cannot
// handle even alone is skipped with an error log and counted as
// flo.tail.skipped by topic: every replica reads every record of a tail, so
// none of them may dead-letter it.
func NewTail(conn config.Kafka, topics []string, h BatchHandler, log *slog.Logger) (*Tail, error) {
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
	// Read committed: the dispatcher writes task events in transactions, and a
	// record of an aborted one never happened.
	cl, err := newClient(conn, kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return nil, fmt.Errorf("new tail: %w", err)
	}
	log = log.With("tail", topics)
	skip, err := newSkipper(log)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("new tail: %w", err)
	}
	is := &isolator{h: newChain(h, log), reject: skip.skip, log: log}
	return &Tail{cl: cl, topics: topics, h: is, log: log, ready: make(chan struct{})}, nil
}

// Run looks up the end offset of every partition of the topics (waiting, with
// a log line now and then, until all topics exist), closes Ready, then hands
// every record from those offsets on to the handler, partition batch by
// partition batch, through the handler chain (see NewTail). It returns nil when
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
			stopped = !t.h.handle(ctx, p.Records)
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
	var start map[string]map[int32]kgo.Offset
	err := retry.Do(ctx, topicWait, func() error {
		listed, err := adm.ListEndOffsets(ctx, t.topics...)
		if err == nil {
			err = listed.Error()
		}
		if err != nil {
			return err
		}
		start = make(map[string]map[int32]kgo.Offset, len(t.topics))
		for _, topic := range t.topics {
			ps, ok := listed[topic]
			if !ok || len(ps) == 0 {
				return fmt.Errorf("topic %s: no partitions", topic)
			}
			start[topic] = make(map[int32]kgo.Offset, len(ps))
			for p, o := range ps {
				start[topic][p] = kgo.NewOffset().At(o.Offset)
			}
		}
		return nil
	}, func(err error, attempt int, _ time.Duration) {
		if attempt == 1 || attempt%10 == 0 {
			t.log.InfoContext(ctx, "tail waiting for topics", "attempt", attempt, "error", err)
		}
	})
	if err != nil {
		return nil, err
	}
	return start, nil
}

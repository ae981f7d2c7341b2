package owner

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/razorbill/flo/libs/kafka"
)

// producer is a partition's transactional client. It counts the producer
// id initializations the client writes, so the partition commits only
// under the one it made itself (see took and tookOnItsOwn).
type producer struct {
	*kgo.Client
	inits initCount
	// took is the count when the partition took the transactional id,
	// after asking the group whether it owns the partition.
	took int64
}

// transactional are the options of every client that takes partition id's
// transactional id: its owners' producers, and Repartition's fence. One id
// per partition, so a partition's next owner fences the one before.
func transactional(id int32) []kgo.Opt {
	return []kgo.Opt{
		kgo.TransactionalID(kafka.DispatcherGroup + "-p" + strconv.Itoa(int(id))),
		kgo.MaxVersions(txnVersions),
		// An owner that dies mid-transaction holds the partition's
		// readers back until this passes or the next owner takes over.
		kgo.TransactionTimeout(10 * time.Second),
	}
}

// newProducer makes the transactional client of partition id.
func (r *Replica) newProducer(id int32) (*producer, error) {
	p := &producer{}
	cl, err := kafka.NewClient(r.cfg.Kafka, append(transactional(id),
		kgo.ProducerLinger(0),
		// Events go to the partition's number, moved commands to their
		// task's (Record.Partition), whatever the client's metadata says.
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.ProducerBatchMaxBytes(int32(max(kafka.MaxRecordSize(r.cfg.MaxPayloadBytes), 1<<20))),
		kgo.WithHooks(&p.inits),
	)...)
	if err != nil {
		return nil, err
	}
	p.Client = cl
	return p, nil
}

// tookOnItsOwn says whether the client initialized its producer id again
// since the partition took the transactional id. franz-go does that to
// recover from a transaction that failed without a clear answer (a
// timeout, a dropped connection; most likely after a pause) on the next
// produce or BeginTransaction, and an initialization that names the
// transactional id takes it from whoever holds it: a replica paused past
// its session would fence the partition's new owner and commit from the
// state it had before the pause.
func (p *producer) tookOnItsOwn() bool { return p.inits.n.Load() != p.took }

// initCount counts the InitProducerID requests a client writes (a
// kgo.HookBrokerWrite).
type initCount struct{ n atomic.Int64 }

// OnBrokerWrite counts every InitProducerID written, whole or not: one
// the broker may have read counts.
func (c *initCount) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, _ error) {
	if key == kmsg.InitProducerID.Int16() {
		c.n.Add(1)
	}
}

// txnVersions caps InitProducerID at version 2 for the partitions'
// producers. From version 3 (KIP-360, KIP-588) franz-go treats some
// refusals of a producer's epoch as recoverable and initializes the
// producer again with that epoch; kfake accepts the old epoch there (Kafka
// refuses it), so a replica resumed after losing its partitions could take
// the id back and commit. At version 2 the refusal is final: the batch
// fails, which fences the partition.
var txnVersions = func() *kversion.Versions {
	v := kversion.Stable()
	v.SetMaxKeyVersion(kmsg.InitProducerID.Int16(), 2)
	return v
}()

// Package record is a stream record as the streams service sees it: its id
// ("<ms>-<seq>"), the positions callers name with ids, and the conversion
// from the log record it is stored as.
package record

import (
	"strconv"
	"strings"

	"github.com/razorbill/flo/libs/fault"
)

// seqPartitions is the factor of a sequence number: seq = offset*1000 +
// partition. Streams have at most 256 partitions, so every partition fits.
const seqPartitions = 1000

// ID identifies a record: MS is its append time in milliseconds, Seq its
// offset times 1000 plus its partition. IDs are unique in a stream and grow
// with the offset within a partition; they compare as (MS, Seq) tuples.
type ID struct {
	MS  int64
	Seq int64
}

// NewID is the id of the record at offset in partition, appended at ms.
func NewID(ms int64, partition int32, offset int64) ID {
	return ID{MS: ms, Seq: offset*seqPartitions + int64(partition)}
}

// Partition is the partition the record is in.
func (id ID) Partition() int32 { return int32(id.Seq % seqPartitions) }

// Offset is the record's offset in its partition.
func (id ID) Offset() int64 { return id.Seq / seqPartitions }

// String formats the id as "<ms>-<seq>".
func (id ID) String() string {
	b := make([]byte, 0, 40)
	b = strconv.AppendInt(b, id.MS, 10)
	b = append(b, '-')
	b = strconv.AppendInt(b, id.Seq, 10)
	return string(b)
}

// Compare orders ids by (MS, Seq): -1, 0 or +1.
func (id ID) Compare(o ID) int {
	switch {
	case id.MS < o.MS:
		return -1
	case id.MS > o.MS:
		return 1
	case id.Seq < o.Seq:
		return -1
	case id.Seq > o.Seq:
		return 1
	}
	return 0
}

// ParseID parses "<ms>-<seq>"; anything else is an Invalid fault.
func ParseID(s string) (ID, error) {
	msText, seqText, ok := strings.Cut(s, "-")
	if ok {
		ms, err1 := strconv.ParseInt(msText, 10, 64)
		seq, err2 := strconv.ParseInt(seqText, 10, 64)
		// ParseInt accepts a sign; ids never carry one.
		if err1 == nil && err2 == nil && ms >= 0 && seq >= 0 && msText[0] != '+' && seqText[0] != '+' {
			return ID{MS: ms, Seq: seq}, nil
		}
	}
	return ID{}, fault.Invalidf("invalid record id %q: want <ms>-<seq>", s)
}

// ParseIDs parses every id of a request; field names the list in errors.
func ParseIDs(field string, ss []string) ([]ID, error) {
	ids := make([]ID, len(ss))
	for i, s := range ss {
		id, err := ParseID(s)
		if err != nil {
			kind, msg, _ := fault.KindOf(err)
			return nil, &fault.Error{Kind: kind, Message: field + "[" + strconv.Itoa(i) + "]: " + msg}
		}
		ids[i] = id
	}
	return ids, nil
}

package kafka

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/google/uuid"
)

// NewEventID is a version 4 UUID for a record's event id, from math/rand/v2's
// per-thread generator: an event id has to be unique, not secret, and
// reading crypto/rand (and, for a version 7 UUID, the clock under a lock)
// for each event was most of the cost of making one.
func NewEventID() uuid.UUID {
	var u uuid.UUID
	binary.LittleEndian.PutUint64(u[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(u[8:], rand.Uint64())
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // RFC 4122 variant
	return u
}

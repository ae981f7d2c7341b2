package kafka

import "context"

// Reading reports whether a tail reading on demand reads now.
func (t *Tail) Reading() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reading != nil
}

// AddNewPartitions is addNewPartitions, which Run does every
// partitionsRefresh.
func (t *Tail) AddNewPartitions(ctx context.Context) error { return t.addNewPartitions(ctx) }

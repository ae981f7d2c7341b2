package service

// ReadTransactions is how many group read transactions the service ran and
// how many reads they served.
func (s *Service) ReadTransactions() (txs, reads int64) { return s.groups.ReadTransactions() }

// Waiters is how many reads wait for wake-ups.
func (s *Service) Waiters() int { return s.hub.Waiters() }

// Probes is how many safety ticks probed the waiting reads.
func (s *Service) Probes() uint64 { return s.hub.Probes() }

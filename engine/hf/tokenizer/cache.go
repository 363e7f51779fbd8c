package tokenizer

import (
	"hash/maphash"
	"strings"
	"sync"
)

// wordCache maps a pre-tokenized word to its ids. It is sharded to keep lock contention low
// when many goroutines encode at once, and bounded (64 shards × 2048 words of at most 128
// bytes; typical text fills it with a few MB): a full shard is emptied and refilled.
type wordCache struct {
	seed   maphash.Seed
	shards [cacheShards]cacheShard
}

const (
	cacheShards        = 64
	cacheEntriesPerShd = 2048
)

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int32
}

func newWordCache() *wordCache {
	c := &wordCache{seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int32)
	}
	return c
}

func (c *wordCache) shard(word string) *cacheShard {
	return &c.shards[maphash.String(c.seed, word)%cacheShards]
}

func (c *wordCache) get(word string) ([]int32, bool) {
	s := c.shard(word)
	s.mu.RLock()
	ids, ok := s.m[word]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(word string, ids []int32) {
	s := c.shard(word)
	cp := make([]int32, len(ids))
	copy(cp, ids)
	s.mu.Lock()
	if len(s.m) >= cacheEntriesPerShd {
		clear(s.m)
	}
	// Clone the key: word is a substring of the caller's text, which must not stay pinned.
	s.m[strings.Clone(word)] = cp
	s.mu.Unlock()
}

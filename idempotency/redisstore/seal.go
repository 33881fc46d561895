package redisstore

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"hash"
	"sync"
)

// sealer authenticates cached records with HMAC-SHA256 under a secret, over
// the record and the Redis key it is stored under. Without it, anything
// that can write to the Redis (another application sharing it, say) could
// forge a replay for any scope, or copy one scope's record to another's
// key; with it, such a record is rejected and read through from the durable
// store instead. It does not hide records from whoever can read Redis.
type sealer struct {
	macs sync.Pool // of hash.Hash keyed with the secret
}

// macSize is the length of the tag at the end of every sealed record.
const macSize = sha256.Size

func newSealer(secret []byte) *sealer {
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret) // never fails (crypto/rand)
	}
	secret = append([]byte(nil), secret...)
	return &sealer{macs: sync.Pool{New: func() any { return hmac.New(sha256.New, secret) }}}
}

// tag is the MAC of record stored under recKey.
func (s *sealer) tag(dst []byte, recKey string, record []byte) []byte {
	mac := s.macs.Get().(hash.Hash)
	defer s.macs.Put(mac)
	mac.Reset()
	var n [binary.MaxVarintLen64]byte
	mac.Write(binary.AppendUvarint(n[:0], uint64(len(recKey))))
	mac.Write([]byte(recKey))
	mac.Write(record)
	return mac.Sum(dst)
}

// seal appends record's tag to it.
func (s *sealer) seal(recKey string, record []byte) []byte {
	return s.tag(record, recKey, record)
}

// open returns the record that sealed holds, or false when its tag does not
// verify for recKey.
func (s *sealer) open(recKey string, sealed []byte) ([]byte, bool) {
	if len(sealed) < macSize {
		return nil, false
	}
	record, tag := sealed[:len(sealed)-macSize], sealed[len(sealed)-macSize:]
	var buf [macSize]byte
	return record, hmac.Equal(s.tag(buf[:0], recKey, record), tag)
}

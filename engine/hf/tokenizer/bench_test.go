package tokenizer

import (
	"compress/gzip"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// benchDocuments returns about totalBytes of mixed text split into documents of a few KB:
// English-like prose with a Zipf-distributed vocabulary, numbers, punctuation, code,
// Chinese, Russian and emoji. It is deterministic.
func benchDocuments(totalBytes int) []string {
	r := rand.New(rand.NewPCG(1, 2))
	syll := []string{"ka", "to", "ri", "an", "the", "ing", "er", "pro", "con", "ma", "ti", "on", "st", "re", "de", "al", "ous", "ly", "sh", "qu"}
	vocab := make([]string, 30000)
	for i := range vocab {
		n := 1 + r.IntN(4)
		var b strings.Builder
		for k := 0; k < n; k++ {
			b.WriteString(syll[r.IntN(len(syll))])
		}
		vocab[i] = b.String()
	}
	zipf := rand.NewZipf(r, 1.1, 1, uint64(len(vocab)-1))
	extras := []string{"中文分词测试", "今天天气很好", "Привет мир", "как дела", "🎉", "👍🏽", "func main() {\n\tfmt.Println(x)\n}\n",
		"def f(x):\n    return x * 2\n", "https://example.com/a/b?c=d", "I'm", "it's", "we'll"}
	var docs []string
	size := 0
	for size < totalBytes {
		var b strings.Builder
		for b.Len() < 4096 {
			switch x := r.IntN(100); {
			case x < 80:
				w := vocab[zipf.Uint64()]
				if r.IntN(10) == 0 {
					w = strings.ToUpper(w[:1]) + w[1:]
				}
				b.WriteString(w)
			case x < 85:
				b.WriteString(strings.Repeat("7", 1+r.IntN(6)))
			case x < 92:
				b.WriteString([]string{",", ".", ";", ":", "!", "?", "(", ")", "\"", "-"}[r.IntN(10)])
			case x < 95:
				b.WriteString("\n")
			default:
				b.WriteString(extras[r.IntN(len(extras))])
			}
			b.WriteByte(' ')
		}
		docs = append(docs, b.String())
		size += b.Len()
	}
	return docs
}

// BenchmarkEncodeQwen3 measures EncodeBatch throughput (all cores) on 4 MB of mixed text
// with the Qwen3 tokenizer. Each iteration starts from an empty word cache.
func BenchmarkEncodeQwen3(b *testing.B) { benchmarkEncode(b, "qwen3") }

// BenchmarkEncodeLlama3 is BenchmarkEncodeQwen3 for the Llama-3 tokenizer.
func BenchmarkEncodeLlama3(b *testing.B) { benchmarkEncode(b, "llama3") }

func benchmarkEncode(b *testing.B, name string) {
	tok := testTokenizer(b, name)
	docs := benchDocuments(4 << 20)
	total := 0
	for _, d := range docs {
		total += len(d)
	}
	b.SetBytes(int64(total))
	b.ResetTimer()
	for b.Loop() {
		tok.cache = newWordCache()
		tok.EncodeBatch(docs)
	}
}

// BenchmarkEncodeQwen3Warm is BenchmarkEncodeQwen3 with the word cache kept between runs.
func BenchmarkEncodeQwen3Warm(b *testing.B) {
	tok := testTokenizer(b, "qwen3")
	docs := benchDocuments(4 << 20)
	total := 0
	for _, d := range docs {
		total += len(d)
	}
	b.SetBytes(int64(total))
	tok.EncodeBatch(docs)
	b.ResetTimer()
	for b.Loop() {
		tok.EncodeBatch(docs)
	}
}

// BenchmarkLoadQwen3 measures parsing the 11 MB Qwen3 tokenizer.json.
func BenchmarkLoadQwen3(b *testing.B) {
	data := gunzipFile(b, filepath.Join("testdata", "qwen3", "tokenizer.json.gz"))
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := FromBytes(data); err != nil {
			b.Fatal(err)
		}
	}
}

func gunzipFile(b *testing.B, path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		b.Fatal(err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// BenchmarkSplitPattern compares the hand-written scanners with regexp2 on 1 MB of mixed text.
func BenchmarkSplitPattern(b *testing.B) {
	text := strings.Join(benchDocuments(1<<20), "")
	for _, name := range []string{"qwen2", "o200k"} {
		pat := knownPatterns[name]
		slow, err := compileRegex(pat)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range []struct {
			engine string
			m      matcher
		}{{"scanner", fastScanner(pat)}, {"regexp2", slow}} {
			b.Run(name+"/"+m.engine, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				var spans []span
				for b.Loop() {
					spans = m.m.findAll(text, spans[:0])
				}
			})
		}
	}
}

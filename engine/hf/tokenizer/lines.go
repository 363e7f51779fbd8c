package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// MaxLineBytes bounds one input line of EncodeLines.
const MaxLineBytes = 256 << 20

// linesPerBatch is how many lines EncodeLines encodes at once (on all cores).
const linesPerBatch = 512

// JSONString is the default line reader of EncodeLines: the line is one JSON string.
func JSONString(line []byte) (string, error) {
	var s string
	if err := json.Unmarshal(line, &s); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return "", fmt.Errorf("want a JSON string, got a JSON %s", te.Value)
		}
		return "", fmt.Errorf("not a JSON string: %v", err)
	}
	return s, nil
}

// EncodeLines reads r line by line, turns each line into text with toText (JSONString when
// nil) and writes the ids of each text to w as one JSON array per line, in input order.
// Lines are encoded in batches on all cores. The first bad line (or one on which a pattern
// runs past its match time, see EncodeErr) stops it with an error "line N: ..." after the
// lines before it have been written.
func (t *Tokenizer) EncodeLines(r io.Reader, w io.Writer, toText func(line []byte) (string, error)) error {
	if toText == nil {
		toText = JSONString
	}
	br := bufio.NewReaderSize(r, 1<<20)
	bw := bufio.NewWriterSize(w, 1<<20)
	var texts []string
	var textLine []int // the line number of each text
	var out []byte
	lineNo := 0
	flush := func() error {
		ids, errs := t.encodeBatch(texts)
		for k, ids := range ids {
			if errs[k] != nil {
				bw.Flush()
				return fmt.Errorf("line %d: %w", textLine[k], errs[k])
			}
			out = append(out[:0], '[')
			for i, id := range ids {
				if i > 0 {
					out = append(out, ',')
				}
				out = strconv.AppendInt(out, int64(id), 10)
			}
			out = append(out, ']', '\n')
			if _, err := bw.Write(out); err != nil {
				return err
			}
		}
		texts, textLine = texts[:0], textLine[:0]
		return nil
	}
	for {
		line, err := readLine(br)
		if err == io.EOF {
			break
		}
		lineNo++
		if err != nil {
			if ferr := flush(); ferr != nil {
				return ferr
			}
			bw.Flush()
			return fmt.Errorf("line %d: %w", lineNo, err)
		}
		text, terr := toText(line)
		if terr != nil {
			if ferr := flush(); ferr != nil {
				return ferr
			}
			if ferr := bw.Flush(); ferr != nil {
				return ferr
			}
			return fmt.Errorf("line %d: %w", lineNo, terr)
		}
		texts, textLine = append(texts, text), append(textLine, lineNo)
		if len(texts) == linesPerBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	return bw.Flush()
}

// readLine returns the next line without its "\n" or "\r\n", io.EOF at the end, or an error
// for a line longer than MaxLineBytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > MaxLineBytes {
			return nil, fmt.Errorf("line longer than %d bytes", MaxLineBytes)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			if len(buf) == 0 {
				return nil, io.EOF
			}
			break
		}
		if err != nil {
			return nil, err
		}
		break
	}
	buf = bytes.TrimSuffix(buf, []byte("\n"))
	buf = bytes.TrimSuffix(buf, []byte("\r"))
	return buf, nil
}

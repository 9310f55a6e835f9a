"""The near-miss verifier's word lists: what changes an answer (numbers, units, negation, opposites, times,
comparatives, quantifiers, names) and what a rephrasing may change freely (filler, synonyms). English and Korean.
Derived lookup tables are built once at import."""

from __future__ import annotations

NUMBER_WORDS = {
    "zero": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6", "seven": "7",
    "eight": "8", "nine": "9", "ten": "10", "eleven": "11", "twelve": "12", "thirteen": "13", "fourteen": "14",
    "fifteen": "15", "sixteen": "16", "seventeen": "17", "eighteen": "18", "nineteen": "19", "twenty": "20",
    "thirty": "30", "forty": "40", "fifty": "50", "hundred": "100", "thousand": "1000", "million": "1e6",
    "billion": "1e9", "half": "0.5", "quarter": "0.25", "dozen": "12", "하나": "1", "둘": "2", "셋": "3", "넷": "4", "다섯": "5", "열": "10", "백": "100", "천": "1000",
    "만": "10000",
}

# canonical unit -> spellings
UNITS = {
    "km": ("km", "kms", "kilometer", "kilometers", "kilometre", "kilometres", "킬로미터", "킬로"),
    "mile": ("mi", "mile", "miles", "마일"),
    "m": ("meter", "meters", "metre", "metres", "미터"),
    "cm": ("cm", "centimeter", "centimeters", "centimetre", "centimetres", "센티미터", "센티"),
    "mm": ("mm", "millimeter", "millimeters"),
    "ft": ("ft", "foot", "feet", "피트"),
    "in": ("inch", "inches", "인치"),
    "yd": ("yd", "yard", "yards"),
    "kg": ("kg", "kgs", "kilogram", "kilograms", "kilo", "kilos", "킬로그램"),
    "g": ("gram", "grams", "그램"),
    "lb": ("lb", "lbs", "pound", "pounds", "파운드"),
    "oz": ("oz", "ounce", "ounces", "온스"),
    "l": ("liter", "liters", "litre", "litres", "리터"),
    "ml": ("ml", "milliliter", "milliliters", "millilitre", "millilitres"),
    "gal": ("gal", "gallon", "gallons", "갤런"),
    "cup": ("cup", "cups"),
    "tbsp": ("tbsp", "tablespoon", "tablespoons"),
    "tsp": ("tsp", "teaspoon", "teaspoons"),
    "c": ("c", "celsius", "centigrade", "°c", "℃", "섭씨"),
    "f": ("f", "fahrenheit", "°f", "℉", "화씨"),
    "k": ("kelvin",),
    "usd": ("usd", "dollar", "dollars", "$", "달러"),
    "eur": ("eur", "euro", "euros", "€", "유로"),
    "gbp": ("gbp", "sterling", "£", "파운드화"),
    "jpy": ("jpy", "yen", "¥", "엔"),
    "krw": ("krw", "won", "₩", "원화"),
    "cny": ("cny", "yuan", "rmb", "위안"),
    "btc": ("btc", "bitcoin", "bitcoins", "비트코인"),
    "mph": ("mph",), "kph": ("kph", "km/h", "kmh"),
    "gb": ("gb", "gigabyte", "gigabytes", "gib"), "mb": ("mb", "megabyte", "megabytes", "mib"),
    "tb": ("tb", "terabyte", "terabytes"), "kb": ("kb", "kilobyte", "kilobytes"),
    "bit": ("bit", "bits"), "byte": ("byte", "bytes"),
    "sec": ("sec", "secs", "second", "seconds", "초"), "min": ("minute", "minutes", "mins", "분"),
    "hour": ("hour", "hours", "hr", "hrs", "시간"), "day": ("day", "days", "일"),
    "week": ("week", "weeks", "주"), "month": ("month", "months", "개월"), "year": ("year", "years", "년"),
    "percent": ("percent", "%", "퍼센트"), "acre": ("acre", "acres"), "hectare": ("hectare", "hectares"),
    "sqft": ("sqft",), "calorie": ("calorie", "calories", "kcal", "칼로리"), "joule": ("joule", "joules"),
    "watt": ("watt", "watts", "w", "kw", "kilowatt", "kilowatts"), "volt": ("volt", "volts", "v"),
    "psi": ("psi",), "bar": ("bar",), "pa": ("pascal", "pascals", "kpa"),
    "deg": ("degree", "degrees", "°", "도"), "rad": ("radian", "radians"),
}
UNIT_OF = {spelling: unit for unit, spellings in UNITS.items() for spelling in spellings}
# Korean units are glued to what follows ("킬로미터인가요"): matched by prefix, longest first.
KO_UNITS = sorted((sp for sp in UNIT_OF if "\uac00" <= sp[0] <= "\ud7a3" and len(sp) > 1), key=len, reverse=True)
# Words that are units only next to a number ("in", "w", "v", "min", "second", "day" are ordinary words too).
UNIT_NEEDS_NUMBER = {"in", "w", "v", "bar", "min", "sec", "second", "seconds", "day", "days", "week", "weeks",
                      "month", "months", "year", "years", "hour", "hours", "g", "m", "c", "f", "k", "도", "분",
                      "초", "일", "주", "년", "엔", "won", "cup", "cups", "degree", "degrees"}

NEGATIONS = {"not", "no", "never", "n't", "cannot", "without", "none", "nobody", "nothing", "neither", "nor",
              "nowhere", "안", "못", "않", "않다", "않아", "않나요", "않아요", "없", "없는", "없어", "없나요", "없어요", "아니",
              "아닌", "아니다", "아니요", "말고", "금지"}

# Pairs whose members flip an answer. Both members are also "polar": one appearing on one side only is a
# change of meaning even without its partner ("start the server" vs "run the server" is left to the
# substitution check; "how to start" vs "how to stop" is caught here).
ANTONYMS = [
    ("buy", "sell"), ("buying", "selling"), ("bought", "sold"), ("purchase", "sell"), ("accept", "decline"),
    ("accept", "reject"), ("approve", "reject"), ("approve", "deny"), ("allow", "deny"), ("allow", "block"),
    ("allow", "forbid"), ("permit", "forbid"), ("enable", "disable"), ("enabled", "disabled"), ("on", "off"),
    ("open", "close"), ("open", "closed"), ("opening", "closing"), ("start", "stop"), ("start", "end"),
    ("begin", "end"), ("beginning", "end"), ("starting", "stopping"), ("pause", "resume"), ("best", "worst"),
    ("better", "worse"), ("ascending", "descending"), ("asc", "desc"), ("increase", "decrease"),
    ("increasing", "decreasing"), ("raise", "lower"), ("rise", "fall"), ("up", "down"), ("upload", "download"),
    ("uploading", "downloading"), ("import", "export"), ("importing", "exporting"), ("input", "output"),
    ("inbound", "outbound"), ("incoming", "outgoing"), ("ingress", "egress"), ("add", "remove"), ("add", "delete"),
    ("adding", "removing"), ("insert", "delete"), ("create", "delete"), ("create", "destroy"),
    ("install", "uninstall"), ("installing", "uninstalling"), ("encrypt", "decrypt"), ("encryption", "decryption"),
    ("encode", "decode"), ("encoding", "decoding"), ("compress", "decompress"), ("compression", "decompression"),
    ("zip", "unzip"), ("lock", "unlock"), ("mount", "unmount"), ("subscribe", "unsubscribe"),
    ("follow", "unfollow"), ("like", "dislike"), ("love", "hate"), ("win", "lose"), ("won", "lost"),
    ("winning", "losing"), ("gain", "loss"), ("profit", "loss"), ("win", "loss"), ("pass", "fail"),
    ("passed", "failed"), ("success", "failure"), ("true", "false"), ("yes", "no"), ("right", "wrong"),
    ("correct", "incorrect"), ("valid", "invalid"), ("legal", "illegal"), ("safe", "unsafe"), ("safe", "dangerous"),
    ("healthy", "unhealthy"), ("possible", "impossible"), ("able", "unable"), ("likely", "unlikely"),
    ("visible", "invisible"), ("public", "private"), ("internal", "external"), ("inside", "outside"),
    ("indoor", "outdoor"), ("indoors", "outdoors"), ("above", "below"), ("over", "under"), ("before", "after"),
    ("early", "late"), ("earlier", "later"), ("earliest", "latest"), ("first", "last"), ("min", "max"),
    ("minimum", "maximum"), ("minimize", "maximize"), ("lowest", "highest"), ("low", "high"), ("lower", "higher"),
    ("least", "most"), ("less", "more"), ("fewer", "more"), ("small", "large"), ("small", "big"),
    ("smaller", "larger"), ("smaller", "bigger"), ("smallest", "largest"), ("smallest", "biggest"),
    ("short", "long"), ("shorter", "longer"), ("shortest", "longest"), ("slow", "fast"), ("slower", "faster"),
    ("slowest", "fastest"), ("cheap", "expensive"), ("cheaper", "pricier"), ("cheapest", "priciest"),
    ("hot", "cold"), ("warm", "cool"), ("hotter", "colder"), ("hottest", "coldest"), ("heat", "cool"),
    ("heating", "cooling"), ("wet", "dry"), ("light", "dark"), ("light", "heavy"), ("lighter", "heavier"),
    ("easy", "hard"), ("easy", "difficult"), ("easier", "harder"), ("simple", "complex"), ("old", "new"),
    ("older", "newer"), ("oldest", "newest"), ("young", "old"), ("younger", "older"), ("youngest", "oldest"),
    ("rich", "poor"), ("strong", "weak"), ("stronger", "weaker"), ("positive", "negative"), ("plus", "minus"),
    ("north", "south"), ("east", "west"), ("northern", "southern"), ("eastern", "western"), ("left", "right"),
    ("top", "bottom"), ("front", "back"), ("forward", "backward"), ("push", "pull"), ("send", "receive"),
    ("sending", "receiving"), ("sent", "received"), ("give", "take"), ("lend", "borrow"), ("lending", "borrowing"),
    ("borrow", "repay"), ("deposit", "withdraw"), ("debit", "credit"), ("arrive", "depart"),
    ("arrival", "departure"), ("arrivals", "departures"), ("enter", "exit"), ("entrance", "exit"),
    ("login", "logout"), ("log in", "log out"), ("sign in", "sign out"), ("connect", "disconnect"),
    ("online", "offline"), ("attach", "detach"), ("include", "exclude"), ("including", "excluding"),
    ("inclusive", "exclusive"), ("with", "without"), ("always", "never"), ("all", "none"), ("everyone", "nobody"),
    ("everything", "nothing"), ("same", "different"), ("similar", "different"), ("equal", "unequal"),
    ("sync", "async"), ("synchronous", "asynchronous"), ("static", "dynamic"), ("mutable", "immutable"),
    ("sorted", "unsorted"), ("ordered", "unordered"), ("signed", "unsigned"), ("upper", "lower"),
    ("uppercase", "lowercase"), ("major", "minor"), ("male", "female"), ("man", "woman"), ("men", "women"),
    ("boy", "girl"), ("husband", "wife"), ("mother", "father"), ("son", "daughter"), ("brother", "sister"),
    ("king", "queen"), ("day", "night"), ("morning", "evening"), ("am", "pm"), ("sunrise", "sunset"),
    ("summer", "winter"), ("spring", "autumn"), ("spring", "fall"), ("past", "future"), ("yesterday", "tomorrow"),
    ("ancient", "modern"), ("odd", "even"), ("prefix", "suffix"), ("head", "tail"), ("leading", "trailing"),
    ("client", "server"), ("frontend", "backend"), ("read", "write"), ("reading", "writing"), ("get", "set"),
    ("getter", "setter"), ("serialize", "deserialize"), ("marshal", "unmarshal"), ("merge", "split"),
    ("join", "split"), ("expand", "collapse"), ("show", "hide"), ("maximize", "minimize"), ("zoom in", "zoom out"),
    ("include", "omit"), ("to", "from"), ("pros", "cons"), ("advantages", "disadvantages"),
    ("benefits", "drawbacks"), ("cause", "effect"), ("question", "answer"), ("구매", "판매"), ("매수", "매도"),
    ("사다", "팔다"), ("최고", "최저"), ("최대", "최소"), ("오름차순", "내림차순"), ("증가", "감소"), ("상승", "하락"), ("켜기", "끄기"),
    ("켜다", "끄다"), ("열기", "닫기"), ("입력", "출력"), ("업로드", "다운로드"), ("수입", "수출"), ("찬성", "반대"), ("장점", "단점"),
    ("안전", "위험"), ("오전", "오후"), ("아침", "저녁"), ("낮", "밤"), ("여름", "겨울"), ("북쪽", "남쪽"), ("동쪽", "서쪽"), ("왼쪽", "오른쪽"),
    ("위", "아래"), ("앞", "뒤"), ("시작", "종료"), ("로그인", "로그아웃"), ("가입", "탈퇴"), ("추가", "삭제"), ("암호화", "복호화"),
    ("압축", "해제"),
]
POLAR = {w for pair in ANTONYMS for w in pair if " " not in w} - {"to", "from", "on", "in", "over", "up", "down",
                                                                      "with", "get", "back", "right", "left",
                                                                      "light", "like", "even", "take", "give",
                                                                      "set", "question", "answer", "all", "day", "am", "pm",
                                                                      "fall", "spring", "read", "top", "head"}
OPPOSITE: dict[str, set[str]] = {}
for _a, _b in ANTONYMS:
    OPPOSITE.setdefault(_a, set()).add(_b)
    OPPOSITE.setdefault(_b, set()).add(_a)

TIME_WORDS = {
    "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon", "evening", "night",
    "midnight", "noon", "weekend", "weekday", "daily", "weekly", "monthly",
    "yearly", "annually", "hourly", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday",
    "january", "february", "march", "april", "june", "july", "august", "september", "october",
    "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
    "spring", "summer", "autumn", "fall", "winter", "next", "last", "previous", "upcoming", "past", "future",
    "오늘", "내일", "어제", "모레", "그제", "지금", "현재", "아침", "점심", "저녁", "밤", "새벽", "오전", "오후", "정오", "자정",
    "주말", "평일", "월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일", "봄", "여름", "가을", "겨울",
    "다음", "지난", "이번", "올해", "내년", "작년",
}

COMPARATIVES = {
    "more", "most", "less", "least", "fewer", "fewest", "better", "best", "worse", "worst", "higher", "highest",
    "lower", "lowest", "larger", "largest", "bigger", "biggest", "smaller", "smallest", "faster", "fastest",
    "slower", "slowest", "cheaper", "cheapest", "longer", "longest", "shorter", "shortest", "older", "oldest",
    "newer", "newest", "earlier", "earliest", "later", "latest", "greater", "greatest", "safer", "safest",
    "easier", "easiest", "harder", "hardest", "stronger", "strongest", "weaker", "weakest", "richer",
    "richest", "poorer", "poorest", "hotter", "hottest", "colder", "coldest", "warmer", "warmest", "cooler",
    "coolest", "heavier", "heaviest", "lighter", "lightest", "popular", "top", "max", "min", "maximum",
    "minimum", "more than", "less than", "최고", "최저", "최대", "최소", "가장", "더", "덜", "제일",
}
EST_NOT_SUPERLATIVE = {"interest", "test", "request", "rest", "est", "forest", "honest", "suggest", "digest",
                        "manifest", "harvest", "protest", "contest", "invest", "latest", "guest", "quest",
                        "chest", "nest", "west", "vest", "pest", "modest", "arrest", "ingest", "unrest",
                        "attest", "midwest", "conquest", "backtest", "pytest", "jest", "priest", "crest"}

# Words a rephrasing may add, drop or swap freely: they do not change what is asked.
FILLER = {
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "doing",
    "have", "has", "had", "i", "me", "my", "we", "our", "you", "your", "it", "its", "this", "that", "these",
    "those", "there", "here", "what", "what's", "which", "who", "whom", "whose", "how", "why", "when", "where",
    "can", "could", "would", "should", "will", "shall", "may", "might", "must", "please", "kindly", "tell",
    "explain", "describe", "show", "give", "let", "know", "want", "need", "like", "wondering", "wonder",
    "curious", "question", "quick", "help", "hi", "hello", "hey", "thanks", "thank", "so", "just", "really",
    "actually", "basically", "exactly", "some", "any", "about", "regarding", "on", "of", "for", "to", "in",
    "at", "by", "as", "and", "or", "if", "then", "than", "also", "too", "very", "much", "many", "way", "ways",
    "best way", "get", "go", "going", "possible", "someone", "somebody", "one", "s", "'s", "us", "they",
    "them", "their", "he", "she", "his", "her", "with", "from", "into", "onto", "up", "out", "over",
    "info", "information", "details", "detail", "overview", "guide", "steps", "step", "process",
    "procedure", "method", "methods", "approach", "mean", "means", "meaning", "definition", "define",
    "work", "works", "working", "use", "used", "using", "make", "made", "sure", "okay", "ok", "well",
    "은", "는", "이", "가", "을", "를", "좀", "요", "주세요", "알려줘", "알려주세요", "뭐야", "뭔가요", "무엇인가요", "어때요",
    "어때", "어떻게", "하나요", "해요", "있나요", "인가요", "가요", "까요", "궁금해요", "말해줘",
}
SYNONYMS = [
    {"big", "large", "huge"}, {"small", "little", "tiny"}, {"fast", "quick", "rapid", "speedy"},
    {"buy", "purchase"}, {"begin", "start", "commence"}, {"end", "finish", "conclude"},
    {"fix", "repair", "resolve", "solve"}, {"error", "exception"}, {"make", "create", "build", "generate"},
    {"obtain", "get", "acquire", "retrieve", "fetch"}, {"find", "locate", "discover", "look"},
    {"need", "require"}, {"use", "utilize", "employ"}, {"car", "automobile", "vehicle"},
    {"picture", "photo", "image"}, {"movie", "film"}, {"doctor", "physician"}, {"job", "work", "career"},
    {"task", "job"}, {"help", "assist", "support"}, {"change", "modify", "alter", "update", "edit"},
    {"remove", "delete", "erase"}, {"show", "display", "print", "list", "view", "see"},
    {"configure", "setup", "set", "configuration", "config"}, {"install", "setup"},
    {"function", "method"}, {"folder", "directory"}, {"app", "application", "program"},
    {"handle", "manage", "deal"}, {"allowed", "permitted"}, {"cost", "price"}, {"correct", "right"},
    {"explain", "describe", "clarify"}, {"quickly", "fast"}, {"difference", "differences", "differ"},
    {"benefit", "advantage"}, {"issue", "problem"}, {"choose", "select", "pick"}, {"run", "execute"},
    {"connect", "link"}, {"check", "verify", "validate"}, {"speed", "performance"},
    {"dataset", "datasets", "data"}, {"model", "models"}, {"library", "package"}, {"all", "every", "each"},
    {"quit", "exit", "leave"}, {"see", "check", "view"}, {"make", "write", "create"},
    {"wrote", "author", "authored", "writer", "written"}, {"painted", "painter"}, {"invented", "inventor"},
    {"discovered", "discoverer"}, {"tall", "height"}, {"founded", "founder"}, {"directed", "director"}, {"composed", "composer"},
]
SYNONYM_OF: dict[str, set[str]] = {}
for _group in SYNONYMS:
    for _w in _group:
        SYNONYM_OF.setdefault(_w, set()).update(_group)

# Common words that may start a sentence capitalised without being a name.
COMMON_STARTERS = {
    "what", "how", "why", "when", "where", "who", "which", "is", "are", "can", "could", "would", "should",
    "do", "does", "did", "will", "please", "tell", "explain", "describe", "give", "show", "list", "convert",
    "translate", "write", "find", "i", "my", "the", "a", "an", "in", "on", "for", "to", "from", "with", "best",
    "worst", "any", "some", "if", "hi", "hello", "hey", "quick", "compare", "calculate", "define", "summarize",
    "create", "make", "get", "set", "use", "using", "recommend", "suggest", "name", "help", "let", "it", "this",
    "that", "there", "weather", "time", "price", "cost", "steps", "ways", "difference", "top", "average",
    "distance", "population", "history", "capital", "meaning", "definition", "by", "at", "as",
}
PLACES = {
    # A small gazetteer for lower-cased place names; capitalised ones are caught as entities anyway.
    "london", "manchester", "liverpool", "birmingham", "leeds", "glasgow", "edinburgh", "bristol", "paris",
    "lyon", "marseille", "berlin", "munich", "hamburg", "frankfurt", "madrid", "barcelona", "rome", "milan",
    "venice", "naples", "amsterdam", "rotterdam", "brussels", "vienna", "zurich", "geneva", "prague",
    "warsaw", "budapest", "lisbon", "porto", "dublin", "oslo", "bergen", "stockholm", "copenhagen",
    "helsinki", "athens", "istanbul", "moscow", "kyiv", "cairo", "lagos", "nairobi", "johannesburg",
    "dubai", "mumbai", "delhi", "bangalore", "karachi", "beijing", "shanghai", "shenzhen", "hong kong",
    "tokyo", "osaka", "kyoto", "seoul", "busan", "incheon", "taipei", "singapore", "bangkok", "hanoi",
    "jakarta", "manila", "sydney", "melbourne", "auckland", "toronto", "vancouver", "montreal", "boston",
    "chicago", "seattle", "denver", "austin", "dallas", "houston", "miami", "atlanta", "phoenix", "portland",
    "nyc", "la", "sf", "mexico", "bogota", "lima", "santiago", "buenos aires", "rio", "sao paulo",
    "france", "germany", "spain", "italy", "england", "scotland", "wales", "ireland", "uk", "usa", "us",
    "canada", "japan", "china", "korea", "india", "brazil", "australia", "russia", "ukraine", "poland",
    "sweden", "norway", "denmark", "finland", "netherlands", "belgium", "switzerland", "austria", "greece",
    "turkey", "egypt", "nigeria", "kenya", "vietnam", "thailand", "indonesia", "philippines", "argentina",
    "서울", "부산", "대구", "인천", "광주", "대전", "울산", "세종", "제주", "수원", "창원", "고양", "용인", "성남", "청주",
    "전주", "포항", "강릉", "춘천", "경주", "여수", "일본", "중국", "미국", "영국", "한국", "도쿄", "오사카", "뉴욕", "런던", "파리",
}
KO_PARTICLES = ("에서는", "으로는", "에게서", "까지는", "부터는", "에서", "으로", "에게", "한테", "까지", "부터", "처럼",
                 "보다", "이랑", "하고", "과의", "와의", "에는", "의", "은", "는", "이", "가", "을", "를", "에", "로", "와", "과",
                 "도", "만", "랑", "요")

# Quantifiers by what they claim: some member, every member, or none. Two questions that quantify the same
# thing differently ("where any item is late" / "where every item is late") ask different things.
QUANTIFIERS = {
    "any": "some", "some": "some", "anything": "some", "anyone": "some", "anybody": "some", "something": "some",
    "someone": "some", "somebody": "some", "either": "some", "exists": "some",
    "every": "all", "all": "all", "each": "all", "everything": "all", "everyone": "all", "everybody": "all",
    "both": "all", "entire": "all", "whole": "all",
    "no": "none", "none": "none", "nothing": "none", "nobody": "none", "neither": "none",
    "most": "most", "majority": "most", "few": "few",
    "어떤": "some", "아무": "some", "일부": "some", "몇몇": "some", "어느": "some",
    "모든": "all", "모두": "all", "각": "all", "전부": "all", "전체": "all",
}

# Direction by position: what follows "from" is where something leaves, what follows "to" where it arrives.
SOURCE_PREPOSITIONS = {"from"}
DESTINATION_PREPOSITIONS = {"to", "into", "onto", "toward", "towards"}
# Words that end a noun phrase (prepositions, conjunctions, question and clause words).
PHRASE_END = {
    "in", "at", "from", "to", "into", "onto", "toward", "towards", "near", "for", "of", "about", "on", "between",
    "vs", "versus", "with", "without", "using", "via", "by", "through", "across", "over", "under", "after",
    "before", "and", "or", "but", "so", "because", "while", "when", "where", "how", "what", "which", "why", "if",
    "then", "than", "is", "are", "was", "were", "do", "does", "did", "can", "could", "should", "would", "will",
}
# "to" after these words starts a verb ("how to copy", "want to move"), not a destination.
INFINITIVE_CUES = {
    "how", "want", "wants", "wanted", "need", "needs", "way", "ways", "able", "try", "trying", "tried", "have", "has",
    "going", "used", "like", "possible", "best", "easiest", "fastest", "simplest", "order", "supposed", "where",
    "what", "when", "who", "why", "whether", "learn", "easy", "hard", "safe", "better", "time", "steps", "plan",
}
